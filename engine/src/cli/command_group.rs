//! The process group an exec's command runs in, and the reaper that ends
//! it when the exec cannot.
//!
//! Why a reaper: `lock exec` promises that nothing the command started runs
//! on once the lock goes back. While the exec lives it kills the group
//! itself; a kill -9 of the exec gives it no chance, and `PR_SET_PDEATHSIG`
//! reaches only the direct child, not what that child left running in the
//! background. So before the command starts, the exec forks a reaper that
//! leads a new process group (the command joins it) and blocks reading a
//! pipe only the exec holds. When the exec dies, however it dies, the
//! kernel closes the pipe, the read returns, and the reaper kills its own
//! group, itself and everything the command left. Its reaction is a context
//! switch, far inside the lease that must run out before anyone else holds
//! the lock. (A child subreaper would not do: it is the exec itself, and it
//! dies with the kill -9.)
//!
//! Why the terminal moves: a command run from an interactive shell may read
//! the terminal (`read ans </dev/tty`). A group that is not the terminal's
//! foreground group is stopped by SIGTTIN when it does, and would hold the
//! lock for ever; so when the exec is in the foreground, the command's group
//! becomes the foreground (Ctrl-C then goes to the command, as it would
//! without the exec) and the exec takes it back when the group is gone.
//!
//! Never allocates or takes a lock between fork and the reaper's end: the
//! forked child of a multi-threaded process may only make async-signal-safe
//! calls.

use std::io;

/// A process group led by a reaper; dropped, it is killed whole.
pub struct CommandGroup {
    /// The reaper's pid, which is the group's id.
    pgid: libc::pid_t,
    /// The write end of the reaper's pipe: open as long as the exec lives.
    alive: libc::c_int,
    /// The controlling terminal, when the group was made its foreground.
    terminal: Option<libc::c_int>,
    ended: bool,
}

/// Highest descriptor the reaper closes (it keeps only its pipe).
const MAX_FD: libc::c_int = 4096;

impl CommandGroup {
    /// Forks the reaper and makes its group; the command joins it with
    /// [`CommandGroup::pgid`].
    pub fn start() -> io::Result<CommandGroup> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [watch, alive] = fds;
        // SAFETY: the child runs only `reap`, which makes async-signal-safe
        // calls and never returns; the parent goes on as before.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = io::Error::last_os_error();
            close(watch);
            close(alive);
            return Err(e);
        }
        if pid == 0 {
            reap(watch);
        }
        close(watch);
        // Both sides set the group (as a shell does), so it exists before
        // the command is spawned into it whichever runs first.
        // SAFETY: setpgid on our own child, with its own pid as the group.
        unsafe { libc::setpgid(pid, pid) };
        let mut group = CommandGroup {
            pgid: pid,
            alive,
            terminal: None,
            ended: false,
        };
        group.take_terminal();
        Ok(group)
    }

    /// The group the command must join.
    pub fn pgid(&self) -> libc::pid_t {
        self.pgid
    }

    /// Sends `sig` to the whole group (the reaper ignores all but SIGKILL).
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) of a group we made; no memory is involved.
        unsafe { libc::kill(-self.pgid, sig) };
    }

    /// Kills whatever is left of the group, the reaper with it, waits for
    /// the reaper, and gives the terminal back. Done before the grant goes
    /// back, on every path.
    pub fn end(mut self) {
        self.end_now();
    }

    fn end_now(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.signal(libc::SIGKILL);
        let mut status = 0;
        // SAFETY: waits for our own child, the reaper, which SIGKILL ends.
        while unsafe { libc::waitpid(self.pgid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        self.give_back_terminal();
        close(self.alive);
    }

    /// When the exec is the terminal's foreground, the group becomes it.
    fn take_terminal(&mut self) {
        // SAFETY: open/tcgetpgrp/tcsetpgrp on a descriptor we own; the path
        // is a NUL-terminated literal.
        unsafe {
            let tty = libc::open(
                c"/dev/tty".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            if tty < 0 {
                return; // no controlling terminal
            }
            if libc::tcgetpgrp(tty) != libc::getpgrp() || libc::tcsetpgrp(tty, self.pgid) != 0 {
                libc::close(tty);
                return;
            }
            self.terminal = Some(tty);
        }
    }

    /// Makes the exec's own group the foreground again. The exec is a
    /// background process by now, so SIGTTOU is blocked for the call.
    fn give_back_terminal(&mut self) {
        let Some(tty) = self.terminal.take() else {
            return;
        };
        // SAFETY: signal-mask calls on this thread with sets we own, and
        // tcsetpgrp/close on a descriptor we own.
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
            libc::tcsetpgrp(tty, libc::getpgrp());
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            libc::close(tty);
        }
    }
}

impl Drop for CommandGroup {
    fn drop(&mut self) {
        self.end_now();
    }
}

fn close(fd: libc::c_int) {
    // SAFETY: closes a descriptor this module opened.
    unsafe { libc::close(fd) };
}

/// The reaper, in the forked child: leads its own group, ignores the
/// signals meant for the command or the exec, waits for the pipe to close
/// (the exec is gone) and kills its group. Async-signal-safe calls only.
fn reap(watch: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls on this process's own state only.
    unsafe {
        libc::setpgid(0, 0);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Everything else the exec had open (its connections, the write end
        // of this very pipe, its terminal) is the exec's, not the reaper's.
        for fd in 0..MAX_FD {
            if fd != watch {
                libc::close(fd);
            }
        }
        let mut byte = 0u8;
        loop {
            let n = libc::read(watch, (&mut byte as *mut u8).cast(), 1);
            if n > 0 {
                continue;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0);
    }
}
