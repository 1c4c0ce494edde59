//! glibc malloc settings for a long-running binary with many threads
//! (issue 21 item 1), applied once at the start of `main`:
//!
//! - a fixed mmap threshold of 1 MiB: large buffers that come and go (the
//!   control plane's 19 MiB password hashes, a large page or log batch)
//!   are mapped and returned to the system when freed. glibc's default
//!   threshold rises to the size of the largest such block freed, after
//!   which those blocks come from an arena and stay resident;
//! - at most two arenas: memory freed on one thread is reused by the others
//!   instead of every thread's arena keeping its own high-water mark.
//!
//! Other C libraries (musl) have no `mallopt` with these parameters; there
//! this does nothing.

/// Applies the settings. Call it first thing in `main`, before any thread
/// starts.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's parameters, and no other
    // thread exists yet to allocate concurrently.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
