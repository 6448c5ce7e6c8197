//! A timeline of a rank's work as Chrome trace events, the JSON that Perfetto
//! (ui.perfetto.dev) and chrome://tracing open: what ran when, on which track, so that what
//! overlaps (a collective behind compute, a copy to host behind the next block) can be seen.
//!
//! Recording is off until [`Engine::start_trace`]; while on, the engine records a span for
//! each operation of the model, each engine call around them, each collective it launches
//! ahead of its use (from launch until the engine saw it land; with P_a, each gather of a kept
//! input's slices), each copy of a kept input
//! (timed on the copy thread itself), each optimizer step and each unit's update in it, each
//! read and write of the optimizer's file (timed on its I/O thread), and counters of the
//! arena's bytes (and the offloaded optimizer's host arena's, and its file's with the file
//! tier) after each call. [`chrome_trace`] lays the traces of several ranks out as one
//! document:
//! one process per rank (`pid`), one thread per [`Lane`] (`tid`), times in microseconds
//! from the earliest event. Collectives in flight overlap each other without nesting, so
//! they are async events (one row each in Perfetto), the other lanes complete events.

use super::engine::Engine;
use serde_json::{json, Value};
use std::time::Instant;

/// The track a span is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The model's operations.
    Compute,
    /// The engine's calls between them: gathers (with their all-gathers' waits), releases,
    /// gradient reductions' launches, kept-input calls.
    Engine,
    /// Copies of kept inputs between the arena and host memory, as the copy thread ran them.
    Copy,
    /// Optimizer steps, one span each, holding a span per unit's update (AdamW, in the
    /// host arena when offloaded) and per all-gather of updated parameters (stages 1-2).
    Optimizer,
    /// Collectives launched ahead of their use (gradient reductions, stage-3 prefetches, P_a's
    /// gathers of kept inputs), from launch until the engine waited for them and saw them
    /// land: an upper bound of their time on the wire.
    Collective,
    /// Reads and writes of the optimizer's file (`--offload-optimizer nvme`), as its I/O
    /// thread ran them: one span per piece and direction, beside the optimizer's updates.
    File,
}

impl Lane {
    const ALL: [Lane; 6] = [
        Lane::Compute,
        Lane::Engine,
        Lane::Copy,
        Lane::Optimizer,
        Lane::Collective,
        Lane::File,
    ];

    fn tid(self) -> usize {
        self as usize + 1
    }

    fn name(self) -> &'static str {
        match self {
            Lane::Compute => "model operations",
            Lane::Engine => "engine calls",
            Lane::Copy => "kept-input copies",
            Lane::Optimizer => "optimizer",
            Lane::Collective => "collectives in flight",
            Lane::File => "optimizer file I/O",
        }
    }
}

/// One span: `name` on `lane` from `start` to `end`, with the bytes it moved if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What ran: an operation's `Debug` form, an engine call, a collective, a copy.
    pub name: String,
    /// Its track.
    pub lane: Lane,
    /// When it started.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
    /// Bytes it moved (copies, collectives).
    pub bytes: Option<u64>,
}

/// One sample of a counter.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The counter.
    pub name: &'static str,
    /// When it was read.
    pub at: Instant,
    /// Its value.
    pub value: u64,
}

/// What a rank recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Spans, in the order they were recorded.
    pub spans: Vec<Span>,
    /// Counter samples, in the order they were read.
    pub samples: Vec<Sample>,
}

/// A collective the engine launched, for its span once it lands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launched {
    /// When it was launched.
    pub at: Instant,
    /// Which collective (`reduce-scatter`, `all-reduce`, `all-gather`).
    pub what: &'static str,
    /// The unit whose blocks it moves.
    pub unit: usize,
    /// The bytes of the block it runs on.
    pub bytes: u64,
}

impl Launched {
    /// `what` on `unit`'s block of `bytes` bytes, launched now.
    pub fn now(what: &'static str, unit: usize, bytes: usize) -> Self {
        Self {
            at: Instant::now(),
            what,
            unit,
            bytes: bytes as u64,
        }
    }
}

impl Trace {
    /// Records `name` on `lane` from `start` until now.
    pub fn span_until_now(&mut self, name: String, lane: Lane, start: Instant) {
        self.spans.push(Span {
            name,
            lane,
            start,
            end: Instant::now(),
            bytes: None,
        });
    }

    /// The earliest instant recorded (`None` for an empty trace).
    pub fn origin(&self) -> Option<Instant> {
        let spans = self.spans.iter().map(|s| s.start);
        spans.chain(self.samples.iter().map(|s| s.at)).min()
    }
}

/// The traces of `ranks` (rank, trace) as one Chrome trace document
/// (`{"traceEvents": [...]}`): complete events (`ph: "X"`) for spans, a begin and an end
/// async event (`ph: "b"`, `"e"`, with the span's index as `id`) for each collective,
/// counter events (`ph: "C"`) for samples, and names for every process and thread.
pub fn chrome_trace(ranks: &[(usize, &Trace)]) -> Value {
    let origin = ranks.iter().filter_map(|(_, t)| t.origin()).min();
    let Some(origin) = origin else {
        return json!({ "traceEvents": [] });
    };
    let micros = |at: Instant| at.saturating_duration_since(origin).as_secs_f64() * 1e6;
    let mut events = Vec::new();
    for &(rank, trace) in ranks {
        events.push(json!({"ph": "M", "name": "process_name", "pid": rank,
            "args": {"name": format!("rank {rank}")}}));
        for lane in Lane::ALL {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": rank,
                "tid": lane.tid(), "args": {"name": lane.name()}}));
        }
        for (id, s) in trace.spans.iter().enumerate() {
            let args = s.bytes.map_or(json!({}), |bytes| json!({ "bytes": bytes }));
            if s.lane == Lane::Collective {
                for (ph, at) in [("b", s.start), ("e", s.end)] {
                    events.push(
                        json!({"ph": ph, "cat": "collective", "id": id, "name": s.name,
                        "pid": rank, "tid": s.lane.tid(), "ts": micros(at), "args": args}),
                    );
                }
            } else {
                events.push(
                    json!({"ph": "X", "name": s.name, "pid": rank, "tid": s.lane.tid(),
                    "ts": micros(s.start), "dur": micros(s.end) - micros(s.start), "args": args}),
                );
            }
        }
        for c in &trace.samples {
            events.push(
                json!({"ph": "C", "name": c.name, "pid": rank, "ts": micros(c.at),
                "args": { "bytes": c.value }}),
            );
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

impl Engine {
    /// Starts recording a timeline (module docs), dropping what was recorded before.
    pub fn start_trace(&mut self) {
        self.trace = Some(Trace::default());
    }

    /// Stops recording and returns what was recorded (`None` when nothing was started).
    /// A delayed parameter update started while recording and still running then keeps
    /// its spans for [`Engine::take_late_trace`].
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take()
    }

    /// The spans of delayed parameter updates that started while recording and landed
    /// after [`Engine::take_trace`] (`None` when there were none): the optimizer track of
    /// the last traced step, which its update reaches one step later.
    pub fn take_late_trace(&mut self) -> Option<Trace> {
        self.late_trace.take()
    }

    /// Records `name()` on `lane` from `start` until now, when recording; `name` is only
    /// called then.
    pub(crate) fn trace_span(&mut self, lane: Lane, start: Instant, name: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.span_until_now(name(), lane, start);
        }
    }

    /// Records a collective launched at `launched` (a [`Launched`]) as landing now, when
    /// recording.
    pub(crate) fn trace_landed(&mut self, launched: &Launched) {
        if let Some(trace) = &mut self.trace {
            trace.spans.push(Span {
                name: format!("{} of unit {}", launched.what, launched.unit),
                lane: Lane::Collective,
                start: launched.at,
                end: Instant::now(),
                bytes: Some(launched.bytes),
            });
        }
    }

    /// Samples the arena's allocated bytes (and the host arena's, offloaded), and moves the
    /// kept-input copies that landed and the kept inputs' gathers waited for into spans, when
    /// recording (they are dropped otherwise).
    pub(crate) fn trace_after_call(&mut self) {
        let landed = self.kept.take_landed();
        let gathered = self.kept.take_gathered();
        let Some(trace) = &mut self.trace else {
            return;
        };
        for g in gathered {
            trace.spans.push(Span {
                name: format!("all-gather of kept input {}", g.k),
                lane: Lane::Collective,
                start: g.launched,
                end: g.landed,
                bytes: Some(g.bytes),
            });
        }
        for (k, t) in landed {
            let way = if t.to_host { "to host" } else { "from host" };
            trace.spans.push(Span {
                name: format!("kept input {k} {way}"),
                lane: Lane::Copy,
                start: t.started,
                end: t.finished,
                bytes: Some(t.bytes as u64),
            });
        }
        let at = Instant::now();
        trace.samples.push(Sample {
            name: "arena bytes",
            at,
            value: self.arena.stats().allocated as u64,
        });
        if let Some(host) = &self.offloaded {
            trace.samples.push(Sample {
                name: "host arena bytes",
                at,
                value: host.arena.stats().allocated as u64,
            });
            if let Some(file) = &host.file {
                trace.samples.push(Sample {
                    name: "file bytes",
                    at,
                    value: file.tier.file_bytes(),
                });
            }
        }
    }
}
