//! The rank processes of one attempt: started with torchrun's variables, watched, and
//! stopped when one fails.

use super::{decide, Decision, LaunchArgs, Policy};
use crate::run::fault::RESTART_COUNT_ENV;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};
use zero_state::complete_states;

/// How long the other ranks get to exit by themselves (each reporting what it saw) after
/// one failed, before they are killed. A survivor of a dead peer fails at once; one waiting
/// on a hung peer fails after its `--comm-timeout`, and the hung one is killed here.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the launcher looks at its children.
const POLL: Duration = Duration::from_millis(20);

/// A rank that failed in an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    /// The rank, or `None` for mpirun, which does not say which of its ranks failed.
    rank: Option<usize>,
    status: String,
    /// Ended by a signal or with a SIGKILL's status (137), not by reporting an error.
    killed: bool,
    /// The launcher's poll round that saw it.
    round: u64,
}

/// The failures of an attempt in the order that names the cause first: killed ranks before
/// ranks that exited with an error, since the survivors of a dead peer exit with an error
/// naming it (and may be reaped first, the order of exits being a race); then by the poll
/// round that saw them.
fn cause_first(mut failures: Vec<Failure>) -> Vec<Failure> {
    failures.sort_by_key(|f| (!f.killed, f.round, f.rank));
    failures
}

/// `rank 1 exited with status 137 (killed) (also: rank 0 exited with status 1)`.
fn describe_failures(failures: &[Failure]) -> String {
    let text = |f: &Failure| match f.rank {
        Some(rank) => format!("rank {rank} {}", f.status),
        None => format!("mpirun {}", f.status),
    };
    let mut out = failures.first().map_or_else(String::new, text);
    if failures.len() > 1 {
        let rest: Vec<String> = failures[1..].iter().map(text).collect();
        out.push_str(&format!(" (then: {})", rest.join(", ")));
    }
    out
}

/// Runs the job `args` describes, restarting it as [`decide`] says.
///
/// # Errors
/// A bad flag, a process that cannot start, or the last failure once the restart budget is
/// spent, naming the rank, its exit status and the budget.
pub fn launch(args: &LaunchArgs) -> Result<(), String> {
    let policy = Policy::of(args)?;
    let backend = flag_value(&args.train, "--backend");
    if let Some(b) = backend.filter(|b| !["tcp", "nccl", "mpi"].contains(b)) {
        return Err(format!(
            "zero-train launch starts one process per rank: --backend tcp (the default \
             here), nccl (torchrun's variables) or mpi (through --mpirun), not {b}"
        ));
    }
    let save = flag_value(&args.train, "--save").map(PathBuf::from);
    let (mut world, mut restarts, mut previous_failed) = (policy.nproc, 0u32, None);
    let began = Instant::now();
    loop {
        let resume = match (restarts, &save) {
            (0, _) | (_, None) => None,
            (_, Some(save)) => newest_state(save),
        };
        let flags = rank_flags(&args.train, resume.as_deref());
        let attempt_began = Instant::now();
        let outcome = match backend {
            Some("mpi") => run_mpirun(&args.mpirun, &flags, world, restarts)?,
            _ => run_attempt(&flags, world, restarts)?,
        };
        let Err(failures) = outcome else {
            eprintln!(
                "zero-train launch: finished with {world} ranks after {restarts} restart(s) \
                 in {:.1} s",
                began.elapsed().as_secs_f64()
            );
            return Ok(());
        };
        let what = format!(
            "attempt {restarts} ({world} ranks) failed after {:.1} s: {}",
            attempt_began.elapsed().as_secs_f64(),
            describe_failures(&failures)
        );
        let failed_rank = failures.first().and_then(|f| f.rank);
        match decide(&policy, restarts, world, failed_rank, previous_failed) {
            Decision::GiveUp => {
                return Err(format!(
                    "{what}; the restart budget (--max-restarts {}) is spent",
                    policy.max_restarts
                ))
            }
            Decision::Restart { world: next } => {
                let from = save
                    .as_deref()
                    .and_then(newest_state)
                    .map_or("the start (no complete state in --save)".into(), |p| {
                        p.display().to_string()
                    });
                eprintln!(
                    "zero-train launch: {what}; restart {} of {} with {next} ranks from {from}",
                    restarts + 1,
                    policy.max_restarts
                );
                previous_failed = failed_rank.filter(|_| next == world);
                (world, restarts) = (next, restarts + 1);
            }
        }
    }
}

/// The newest complete state of `save`, if any.
fn newest_state(save: &Path) -> Option<PathBuf> {
    complete_states(save)
        .ok()
        .and_then(|states| states.last().map(|(_, path)| path.clone()))
}

/// The value of `--name V` or `--name=V` in `flags` (the last one given).
fn flag_value<'a>(flags: &'a [String], name: &str) -> Option<&'a str> {
    let mut value = None;
    for (i, flag) in flags.iter().enumerate() {
        if flag == name {
            value = flags.get(i + 1).map(String::as_str);
        } else if let Some(v) = flag.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            value = Some(v);
        }
    }
    value
}

/// The flags of every rank: the user's, `--backend tcp` unless a backend is given, and
/// `--resume STATE` in place of the user's own when restarting from a state.
fn rank_flags(train: &[String], resume: Option<&Path>) -> Vec<String> {
    let mut flags = Vec::with_capacity(train.len() + 4);
    let mut skip_next = false;
    for flag in train {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        if resume.is_some() && flag == "--resume" {
            skip_next = true;
            continue;
        }
        if resume.is_some() && flag.starts_with("--resume=") {
            continue;
        }
        flags.push(flag.clone());
    }
    if flag_value(train, "--backend").is_none() {
        flags.extend(["--backend".into(), "tcp".into()]);
    }
    if let Some(state) = resume {
        flags.extend(["--resume".into(), state.display().to_string()]);
    }
    flags
}

/// Starts `world` ranks with `flags` and waits for them: `Ok(Ok(()))` when all succeeded,
/// `Ok(Err(failures))` otherwise, cause first (never empty; the others stopped).
///
/// # Errors
/// The executable, a port or a process that cannot be had.
fn run_attempt(
    flags: &[String],
    world: usize,
    attempt: u32,
) -> Result<Result<(), Vec<Failure>>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find zero-train itself: {e}"))?;
    let port = free_port()?;
    let mut children = Vec::with_capacity(world);
    for rank in 0..world {
        let spawned = Command::new(&exe)
            .args(flags)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", world.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(RESTART_COUNT_ENV, attempt.to_string())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(e) => {
                stop(&mut children);
                return Err(format!("cannot start rank {rank} ({}): {e}", exe.display()));
            }
        }
    }
    Ok(watch(children))
}

/// Waits until every rank exited, or one failed and the others had [`STOP_GRACE`] to exit.
fn watch(mut children: Vec<Child>) -> Result<(), Vec<Failure>> {
    let mut running = vec![true; children.len()];
    let mut failures = Vec::new();
    let mut first_failed: Option<Instant> = None;
    let mut round = 0u64;
    while running.iter().any(|&r| r) {
        for (rank, child) in children.iter_mut().enumerate() {
            let exited = running[rank].then(|| child.try_wait());
            let (status, killed) = match exited {
                Some(Ok(Some(status))) if status.success() => {
                    running[rank] = false;
                    continue;
                }
                Some(Ok(Some(status))) => (describe(status), was_killed(status)),
                Some(Err(e)) => (format!("could not be watched: {e}"), false),
                _ => continue,
            };
            running[rank] = false;
            first_failed.get_or_insert_with(Instant::now);
            failures.push(Failure {
                rank: Some(rank),
                status,
                killed,
                round,
            });
        }
        if first_failed.is_some_and(|at| at.elapsed() > STOP_GRACE) {
            stop(&mut children);
            break;
        }
        round += 1;
        std::thread::sleep(POLL);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(cause_first(failures))
    }
}

/// True for a status a kill leaves: a signal, or 137 (a SIGKILL as a shell reports it).
fn was_killed(status: ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.signal().is_some() {
            return true;
        }
    }
    status.code() == Some(137)
}

/// Runs the attempt as one `mpirun -np world` of zero-train with `flags`: its ranks learn
/// the attempt from the environment mpirun hands them. mpirun ends the job when a rank dies
/// and reports only its own status, so the failure names no rank.
///
/// # Errors
/// An empty `--mpirun`, or a command that cannot start.
fn run_mpirun(
    mpirun: &str,
    flags: &[String],
    world: usize,
    attempt: u32,
) -> Result<Result<(), Vec<Failure>>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find zero-train itself: {e}"))?;
    let mut words = mpirun.split_whitespace();
    let program = words.next().ok_or("--mpirun is empty")?;
    let status = Command::new(program)
        .args(words)
        .args(["-np", &world.to_string()])
        .arg(&exe)
        .args(flags)
        .env(RESTART_COUNT_ENV, attempt.to_string())
        .status()
        .map_err(|e| format!("cannot start {mpirun:?}: {e}"))?;
    if status.success() {
        return Ok(Ok(()));
    }
    Ok(Err(vec![Failure {
        rank: None,
        status: describe(status),
        killed: was_killed(status),
        round: 0,
    }]))
}

/// Kills every child still running and reaps them all.
fn stop(children: &mut [Child]) {
    for child in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            // A child that exited meanwhile makes kill fail harmlessly.
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// An exit status as a sentence: its code, or the signal that ended it.
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    match status.code() {
        Some(137) => "exited with status 137 (killed)".into(),
        Some(code) => format!("exited with status {code}"),
        None => format!("ended: {status}"),
    }
}

/// A port that was free a moment ago (bound to port 0, then released).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port for MASTER_PORT: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{cause_first, describe_failures, flag_value, rank_flags, Failure};
    use std::path::Path;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn failure(rank: usize, killed: bool, round: u64) -> Failure {
        let status = if killed {
            "was killed"
        } else {
            "exited with status 1"
        };
        Failure {
            rank: Some(rank),
            status: status.into(),
            killed,
            round,
        }
    }

    #[test]
    fn the_cause_is_a_killed_rank_before_its_reporting_peers_then_the_first_seen() {
        let same_round = cause_first(vec![failure(0, false, 3), failure(1, true, 3)]);
        assert_eq!(
            describe_failures(&same_round),
            "rank 1 was killed (then: rank 0 exited with status 1)"
        );
        // A peer reaped before the killed rank does not take the blame.
        let reaped_first = cause_first(vec![failure(0, false, 3), failure(2, true, 4)]);
        assert_eq!(reaped_first[0].rank, Some(2));
        let errors = cause_first(vec![failure(2, false, 4), failure(1, false, 3)]);
        assert_eq!(errors[0].rank, Some(1));
    }

    #[test]
    fn flags_are_found_in_both_spellings_the_last_winning() {
        let f = strings(&["--save", "a", "--steps=3", "--save=b"]);
        assert_eq!(flag_value(&f, "--save"), Some("b"));
        assert_eq!(flag_value(&f, "--steps"), Some("3"));
        assert_eq!(flag_value(&f, "--save-every"), None);
    }

    #[test]
    fn a_restart_resumes_from_the_state_given_in_place_of_the_users() {
        let f = strings(&["--resume", "old", "--steps", "6", "--resume=older"]);
        assert_eq!(
            rank_flags(&f, Some(Path::new("s/step-000003"))),
            strings(&[
                "--steps",
                "6",
                "--backend",
                "tcp",
                "--resume",
                "s/step-000003"
            ])
        );
        let nccl = strings(&["--backend", "nccl", "--resume", "old"]);
        assert_eq!(rank_flags(&nccl, None), nccl);
    }
}
