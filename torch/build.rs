//! Builds the small C++ shim around `torch::jit` (loading modules with their argument names, compiling
//! TorchScript source) and its sandbox (what models and scripts may reach, memory and time bounds) against the
//! libtorch in $LIBTORCH, and records an rpath to it so that redis-server
//! needs no LD_LIBRARY_PATH.
use std::path::PathBuf;

fn main() {
    let libtorch = PathBuf::from(
        std::env::var("LIBTORCH").expect("LIBTORCH must point at the libtorch cache (make build sets it)"),
    );
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    // The shim and the sandbox (sandbox.cpp lists its files). torch/tests/run-cpp-tests.sh builds the sandbox's
    // scanners with the same flags: keep the two in step.
    let sources = [
        "src/shim.cpp",
        "src/sandbox.cpp",
        "src/sandbox_policy.cpp",
        "src/sandbox_calls.cpp",
        "src/sandbox_archive.cpp",
        "src/sandbox_scan.cpp",
        "src/sandbox_limits.cpp",
        "src/sandbox_ops.cpp",
    ];
    for file in sources.iter().chain(&[
        "src/sandbox.h",
        "src/sandbox_policy.h",
        "src/sandbox_calls.h",
        "src/sandbox_scan.h",
        "src/sandbox_limits.h",
        "src/sandbox_ops.h",
    ]) {
        println!("cargo:rerun-if-changed={file}");
    }
    let include = libtorch.join("include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .files(sources)
        .compile("redisai_torch_shim");
    let lib = libtorch.join("lib");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // $ORIGIN first: `make dist` puts libtorch beside the backend (RedisAI's backends/redisai_torch/ layout).
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
