//! A line of processes: each forks its successor and exits `life-us`
//! later, so at any moment one or two are alive, each born after the one
//! before was last looked at. The lock exec's tests use it to check that
//! such a line is killed whole. Usage: `chain-forker <members> <life-us>`;
//! the last member sleeps up to 30 s.

fn main() {
    let mut args = std::env::args().skip(1);
    let members: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let life_us: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    for _ in 0..members {
        // SAFETY: this process is single-threaded; fork, usleep and _exit
        // have no memory of their own.
        unsafe {
            match libc::fork() {
                0 => continue,
                pid if pid > 0 => {
                    libc::usleep(life_us);
                    libc::_exit(0);
                }
                _ => libc::_exit(1),
            }
        }
    }
    // SAFETY: sleep has no memory.
    unsafe { libc::sleep(30) };
}
