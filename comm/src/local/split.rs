//! `split(color, key)` on the local backend: ranks with the same color form a new group,
//! ordered by (key, old rank); the lowest old rank of each color creates the shared state
//! and publishes it for the others.

use std::sync::Arc;

use crate::error::{CommError, Result};
use crate::op::OpDesc;

use super::group::{Group, Io, Member, Slot};

/// Returns (new rank, new group) for `m`.
pub(crate) fn split(
    m: &Member,
    desc: &OpDesc,
    color: u32,
    key: u32,
) -> Result<(usize, Arc<Group>)> {
    m.group.publish(m.rank, |s| s.split = (color, key));
    let io = Io {
        send: Default::default(),
        recv: Default::default(),
        in_place: true,
    };
    let entered = m.enter(desc, io)?;
    let mut members: Vec<(u32, usize)> = entered
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.split.0 == color)
        .map(|(r, s)| (s.split.1, r))
        .collect();
    members.sort_unstable();
    let new_rank = members.iter().position(|&(_, r)| r == m.rank).unwrap_or(0);
    let leader = members.iter().map(|&(_, r)| r).min().unwrap_or(m.rank);
    if leader == m.rank {
        let child = Arc::new(Group::new(members.len(), m.group.config));
        m.group.publish(m.rank, |s| s.child = Some(child));
    }
    m.exit(desc)?;
    let child = m.group.read(leader).child;
    // The leader republishes nothing until everyone passed this wait, so `child` is the
    // group it made for this split.
    m.exit(desc)?;
    if leader == m.rank {
        m.group.publish(m.rank, |s: &mut Slot| s.child = None);
    }
    let child = child.ok_or_else(|| CommError::InvalidArgument {
        what: format!("split #{}: leader {leader} published no group", desc.seq),
    })?;
    Ok((new_rank, child))
}
