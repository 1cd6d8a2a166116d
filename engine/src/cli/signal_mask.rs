//! The signal mask the binary starts with: none.
//!
//! Why: a signal mask is inherited across exec, so a caller that blocked
//! SIGTERM (the seventeenth attack) made `lock exec` deaf to it: the
//! command ran on after the caller asked it to stop. `main` clears it
//! before any thread starts, so every thread begins with none.

/// Clears the signal mask this process inherited.
pub fn unblock_all_signals() {
    // SAFETY: sigprocmask with a mask made here and no old mask asked for.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}
