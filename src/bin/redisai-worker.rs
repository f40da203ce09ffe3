//! The backend worker that the module starts when backends run isolated (load-time `EXECUTION_MODE ISOLATED`):
//! see src/isolation/worker.rs.

fn main() {
    std::process::exit(redisai::isolation::worker::main());
}
