//! Rank 0's display: a progress bar on a terminal, plain lines otherwise.

use crate::run::metrics::StepMetrics;
use std::io::IsTerminal;

/// The bar (when stderr is a terminal and this process reports) or nothing.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A bar over `steps` steps if `shown` and stderr is a terminal.
    pub(crate) fn new(steps: u64, shown: bool) -> Self {
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(steps);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Self { bar }
    }

    /// Shows a finished step: the bar's message, or a `step N | ...` line.
    pub(crate) fn step(&self, m: &StepMetrics) {
        let mut msg = format!(
            "loss {:.4} | lr {:.2e} | norm {:.3} | {:.0} tok/s | {:.0} ms",
            m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms
        );
        if m.skipped {
            msg.push_str(&format!(
                " | fp16 overflow at loss scale {}: step skipped",
                m.loss_scale
            ));
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(m.step);
                bar.set_message(msg);
            }
            None => eprintln!("step {} | {msg}", m.step),
        }
    }

    /// Prints a line above the bar (or on its own).
    pub(crate) fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Leaves the finished bar on screen.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
