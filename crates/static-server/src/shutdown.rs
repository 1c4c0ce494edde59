//! Exit promptly on SIGTERM and SIGINT. In a container this binary is PID 1,
//! and the kernel ignores signals that PID 1 has no handler for, so without
//! one `docker stop` would wait out its whole grace period and then kill.
//! There is no state to flush (every response is written straight from the
//! file), so the handler simply exits.

use std::os::raw::c_int;

const SIGINT: c_int = 2;
const SIGTERM: c_int = 15;

// Declared by hand because the crate takes no dependencies (not even the
// `libc` crate); std already links the C library that provides both.
extern "C" {
    fn signal(signum: c_int, handler: extern "C" fn(c_int)) -> usize;
    fn _exit(status: c_int) -> !;
}

extern "C" fn exit_now(_signum: c_int) {
    // SAFETY: _exit is async-signal-safe, unlike std::process::exit, which
    // runs atexit handlers and may take locks the interrupted thread holds.
    unsafe { _exit(0) }
}

/// Installs the handlers; call once at startup.
pub fn exit_on_termination_signals() {
    for signum in [SIGINT, SIGTERM] {
        // SAFETY: the handler only calls an async-signal-safe function, and
        // installing a handler has no other effect on the process's state.
        unsafe {
            signal(signum, exit_now);
        }
    }
}
