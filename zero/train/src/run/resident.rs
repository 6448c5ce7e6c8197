//! The process's resident memory (Linux `/proc/self/status`), reported beside the arenas'
//! figures so a reader can see the two agree: with the local backend every rank is a thread
//! of this process, so the process holds every rank's arena plus what lives outside them
//! (the code, the data loader's buffers, thread stacks, the allocator's slack).

/// Resident set sizes of the process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    /// Resident now (`VmRSS`).
    pub now: u64,
    /// The high-water mark since the process started (`VmHWM`).
    pub peak: u64,
}

/// The process's resident memory, or `None` where `/proc/self/status` is not readable.
pub fn resident() -> Option<Resident> {
    parse_status(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// Reads `VmRSS` and `VmHWM` (in kB) out of a `/proc/<pid>/status` text.
fn parse_status(status: &str) -> Option<Resident> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..]
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kb.checked_mul(1024)
    };
    Some(Resident {
        now: field("VmRSS:")?,
        peak: field("VmHWM:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_fields_are_read_in_bytes() {
        let status = "Name:\tzero-train\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n";
        assert_eq!(
            parse_status(status),
            Some(Resident {
                now: 100 << 20,
                peak: 200 << 20
            })
        );
        assert_eq!(parse_status("VmRSS:\t12 MB\nVmHWM:\t1 kB\n"), None);
        assert_eq!(parse_status(""), None);
    }

    #[test]
    fn this_process_holds_what_it_touched() {
        let Some(before) = resident() else {
            return; // No /proc here: nothing to compare.
        };
        let block = vec![1u8; 64 << 20];
        let after = resident().unwrap();
        assert!(
            after.peak >= before.now + (32 << 20),
            "{before:?} -> {after:?}"
        );
        assert!(after.peak >= after.now);
        drop(block);
    }
}
