//! The backend worker that the module starts when backends run isolated (load-time `EXECUTION_MODE ISOLATED`):
//! see src/isolation/worker.rs.

// Links jemalloc, whose unprefixed malloc and free then serve the whole process (Cargo.toml).
use tikv_jemalloc_sys as _;

fn main() {
    std::process::exit(redisai::isolation::worker::main());
}
