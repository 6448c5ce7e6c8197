//! [`Collectives`] on host arenas through the engine's [`Communicator`]: blocking calls take
//! views of the blocks, launches lend the block to the communicator's progress thread
//! ([`zero_alloc::Lent`]), which is what keeps it pinned until the flight lands.

use bytemuck::Pod;
use zero_alloc::{Arena, Handle, Lent};
use zero_comm::{Communicator, DType, Element, ReduceOp, StagingRule, Work};

use super::{Collectives, Flight, InPlace, Land};
use crate::error::Result;
use crate::kernels::{part, part_mut, Span};
use crate::precision::with_dtype;

/// Model-state collectives on the engine's own communicator.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostCollectives;

impl Collectives for HostCollectives {
    fn name(&self) -> &'static str {
        "host"
    }

    fn staging_rule(&self, comm: &Communicator) -> StagingRule {
        comm.staging_rule()
    }

    fn all_gather(
        &mut self,
        comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        src: Span,
        dst: Span,
    ) -> Result<()> {
        const WHAT: &str = "all_gather";
        with_dtype!(dtype, S => {
            let mut views = arena.views();
            let from = part(WHAT, views.get::<S>(src.block)?, src)?;
            comm.all_gather(from, part_mut(WHAT, views.get_mut::<S>(dst.block)?, dst)?)?;
        });
        Ok(())
    }

    fn launch(
        &mut self,
        comm: &Communicator,
        arena: &mut Arena,
        dtype: DType,
        op: InPlace,
        block: Handle,
    ) -> Result<Flight> {
        with_dtype!(dtype, S => launch_typed::<S>(comm, arena, op, block))
    }
}

fn launch_typed<S: Element + Pod>(
    comm: &Communicator,
    arena: &mut Arena,
    op: InPlace,
    block: Handle,
) -> Result<Flight> {
    let lent = arena.lend::<S>(block)?;
    let work = match op {
        InPlace::AllReduceAvg => comm.all_reduce_async(lent, ReduceOp::Avg),
        InPlace::ReduceScatterAvg => comm.reduce_scatter_async(lent, ReduceOp::Avg),
        InPlace::AllGather => comm.all_gather_async(lent),
    };
    Ok(Flight::new(Lending(work)))
}

/// A collective running on the communicator's progress thread with the lent block.
struct Lending<S>(Work<Lent<S>>);

impl<S: Pod + Send> Land for Lending<S> {
    fn land(self: Box<Self>, arena: &mut Arena) -> Result<Handle> {
        let lent = self.0.wait()?;
        Ok(arena.take_back(lent)?)
    }
}
