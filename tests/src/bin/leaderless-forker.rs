//! A process whose main thread leaves (`pthread_exit`) while another
//! thread keeps forking: /proc shows it a zombie, yet it forks on. The lock
//! exec's tests use it to check that a zombie with live threads is still
//! killed. Usage: `leaderless-forker <children> <every-ms>`; each child
//! sleeps up to 30 s, then exits. Its `main` is C's: Rust's would catch
//! the unwinding `pthread_exit` does and abort.

#![no_main]

/// The process's entry point, called by the C runtime.
#[no_mangle]
pub extern "C-unwind" fn main(
    _argc: libc::c_int,
    _argv: *const *const libc::c_char,
) -> libc::c_int {
    let mut args = std::env::args().skip(1);
    let children: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let every_us: u32 = args
        .next()
        .and_then(|a| a.parse::<u32>().ok())
        .unwrap_or(2)
        .saturating_mul(1000);
    std::thread::spawn(move || {
        for _ in 0..children {
            // SAFETY: the child makes only async-signal-safe calls (sleep,
            // _exit), as a child of a threaded process must.
            unsafe {
                if libc::fork() == 0 {
                    libc::sleep(30);
                    libc::_exit(0);
                }
                while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
                libc::usleep(every_us);
            }
        }
        // SAFETY: sleep has no memory.
        unsafe { libc::sleep(30) };
    });
    // SAFETY: ends only the main thread; the one above runs on, which is
    // the point (the process stays a zombie with a live thread).
    unsafe { libc::pthread_exit(std::ptr::null_mut()) }
}
