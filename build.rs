//! Records the git commit for INFO's `ai_git_sha`, and tracks the backend cache path the build bakes in.
use std::process::Command;

fn main() {
    let sha = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=REDISAI_GIT_SHA={sha}");
    // The default ONNX Runtime path is compiled in (src/backends/onnx.rs); rebuild when it moves.
    println!("cargo:rerun-if-env-changed=REDISAI_ONNX_LIB_DIR");
    println!("cargo:rerun-if-env-changed=REDISAI_TF_LIB_DIR");
    // ONNX Runtime's allocations fail by C++ exception, thrown from this small file (see its comment).
    if std::env::var_os("CARGO_FEATURE_ONNX").is_some() {
        println!("cargo:rerun-if-changed=src/backends/onnx_alloc.cpp");
        cc::Build::new().cpp(true).pic(true).file("src/backends/onnx_alloc.cpp").compile("redisai_onnx_alloc");
    }
    // LiteRT's operator new/delete, counted against the memory bound (src/backends/tflite/alloc.cpp).
    if std::env::var_os("CARGO_FEATURE_TFLITE").is_some() {
        println!("cargo:rerun-if-changed=src/backends/tflite/alloc.cpp");
        cc::Build::new().cpp(true).pic(true).file("src/backends/tflite/alloc.cpp").compile("redisai_tflite_alloc");
    }
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}
