//! The rank processes of one attempt: started with torchrun's variables, watched, and
//! stopped when one fails.

use super::{decide, Decision, LaunchArgs, Policy};
use crate::checkpoint::complete_states;
use crate::fault::RESTART_COUNT_ENV;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long the other ranks get to exit by themselves (each reporting what it saw) after
/// one failed, before they are killed. A survivor of a dead peer fails at once; one waiting
/// on a hung peer fails after its `--comm-timeout`, and the hung one is killed here.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the launcher looks at its children.
const POLL: Duration = Duration::from_millis(20);

/// The first rank that failed in an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    rank: usize,
    status: String,
}

/// Runs the job `args` describes, restarting it as [`decide`] says.
///
/// # Errors
/// A bad flag, a process that cannot start, or the last failure once the restart budget is
/// spent, naming the rank, its exit status and the budget.
pub fn launch(args: &LaunchArgs) -> Result<(), String> {
    let policy = Policy::of(args)?;
    if let Some(b) = flag_value(&args.train, "--backend").filter(|b| !["tcp", "nccl"].contains(b)) {
        return Err(format!(
            "zero-train launch starts one process per rank with torchrun's variables: \
             --backend tcp (the default here) or nccl, not {b}"
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
        let Err(failure) = run_attempt(&flags, world, restarts)? else {
            eprintln!(
                "zero-train launch: finished with {world} ranks after {restarts} restart(s) \
                 in {:.1} s",
                began.elapsed().as_secs_f64()
            );
            return Ok(());
        };
        let what = format!(
            "attempt {restarts} ({world} ranks) failed after {:.1} s: rank {} {}",
            attempt_began.elapsed().as_secs_f64(),
            failure.rank,
            failure.status
        );
        match decide(&policy, restarts, world, failure.rank, previous_failed) {
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
                previous_failed = (next == world).then_some(failure.rank);
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
/// `Ok(Err(first failure))` otherwise (the others stopped).
///
/// # Errors
/// The executable, a port or a process that cannot be had.
fn run_attempt(
    flags: &[String],
    world: usize,
    attempt: u32,
) -> Result<Result<(), Failure>, String> {
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
fn watch(mut children: Vec<Child>) -> Result<(), Failure> {
    let mut running = vec![true; children.len()];
    let mut failure: Option<(Failure, Instant)> = None;
    while running.iter().any(|&r| r) {
        for (rank, child) in children.iter_mut().enumerate() {
            let exited = running[rank].then(|| child.try_wait());
            match exited {
                Some(Ok(Some(status))) => {
                    running[rank] = false;
                    if !status.success() && failure.is_none() {
                        let status = describe(status);
                        failure = Some((Failure { rank, status }, Instant::now()));
                    }
                }
                Some(Err(e)) if failure.is_none() => {
                    running[rank] = false;
                    let status = format!("could not be watched: {e}");
                    failure = Some((Failure { rank, status }, Instant::now()));
                }
                _ => {}
            }
        }
        if failure
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() > STOP_GRACE)
        {
            stop(&mut children);
            break;
        }
        std::thread::sleep(POLL);
    }
    failure.map_or(Ok(()), |(f, _)| Err(f))
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
    use super::{flag_value, rank_flags};
    use std::path::Path;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
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
