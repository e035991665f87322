//! Resident memory and CPU time of a process, from `/proc` (Linux only).
//!
//! Used for the broker (its PID is passed in) and for the generator itself, so a result says
//! how much of the machine each side took: on a shared 2-core box a saturated generator
//! would otherwise pass for a slow broker.

use std::path::PathBuf;

/// A process to observe.
#[derive(Clone, Copy, Debug)]
pub enum Proc {
    Own,
    Pid(u32),
}

impl Proc {
    fn path(self, file: &str) -> PathBuf {
        match self {
            Proc::Own => PathBuf::from(format!("/proc/self/{file}")),
            Proc::Pid(pid) => PathBuf::from(format!("/proc/{pid}/{file}")),
        }
    }

    /// Resident set size in KiB (`VmRSS`), or `None` if the process is gone.
    pub fn rss_kib(self) -> Option<u64> {
        parse_vm_rss(&std::fs::read_to_string(self.path("status")).ok()?)
    }

    /// User + system CPU time in seconds, or `None` if the process is gone.
    pub fn cpu_seconds(self) -> Option<f64> {
        let ticks = parse_stat_cpu_ticks(&std::fs::read_to_string(self.path("stat")).ok()?)?;
        // SAFETY: sysconf has no preconditions; it only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ticks as f64 / hz as f64)
    }
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime (fields 14 and 15) in clock ticks. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A CPU and RSS reading to diff against a later one.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub cpu_s: Option<f64>,
    pub rss_kib: Option<u64>,
}

impl Sample {
    pub fn take(p: Proc) -> Self {
        Self { cpu_s: p.cpu_seconds(), rss_kib: p.rss_kib() }
    }

    /// CPU seconds used since `earlier`.
    pub fn cpu_since(&self, earlier: &Sample) -> Option<f64> {
        Some(self.cpu_s? - earlier.cpu_s?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tsilt\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads:\t5\n";
        assert_eq!(parse_vm_rss(status), Some(12345));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces() {
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1 0 0 0 150 25 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(175));
    }

    #[test]
    fn own_process_is_observable() {
        assert!(Proc::Own.rss_kib().is_some_and(|kib| kib > 0));
        assert!(Proc::Own.cpu_seconds().is_some());
    }
}
