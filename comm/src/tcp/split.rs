//! `split(color, key)` over TCP: two star exchanges on the parent group, then new groups.
//!
//! 1. Every rank sends (`color: u32`, `key: u32`); rank 0 orders each colour's members by
//!    (key, old rank) and answers each rank (`new_rank: u32`, `new_size: u32`,
//!    `leader: u32`), the leader being the colour's new rank 0.
//! 2. Each leader of a colour with more than one member binds an ephemeral port on the
//!    address its parent link uses and sends it as text; the others send nothing. Rank 0
//!    answers each non-leader with its leader's address.
//! 3. Leaders accept their group ([`Listener`]), the others join it, under the group's timeout.
//!
//! Decision: fresh connections per group keep every group's stream of frames independent, so
//! a parent and its children can run collectives in any interleaving. Rejected: multiplexing
//! children over the parent's sockets, which would need a demultiplexer thread per link.

use std::net::SocketAddr;

use crate::error::{CommError, Result};
use crate::op::OpDesc;

use super::connect::{join_backend, Listener};
use super::star::LenRule;
use super::TcpComm;

/// Longest address text a leader sends.
const MAX_ADDR: usize = 128;

fn u32_at(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[i..i + 4]);
    u32::from_le_bytes(w)
}

/// Rank 0's assignment: (new rank, new size, leader's old rank) for every old rank.
fn assign(pairs: &[(u32, u32)]) -> Vec<(usize, usize, usize)> {
    (0..pairs.len())
        .map(|r| {
            let color = pairs[r].0;
            let mut members: Vec<(u32, usize)> = (0..pairs.len())
                .filter(|&j| pairs[j].0 == color)
                .map(|j| (pairs[j].1, j))
                .collect();
            members.sort_unstable();
            let new_rank = members.iter().position(|&(_, j)| j == r).unwrap_or(0);
            (new_rank, members.len(), members.first().map_or(r, |m| m.1))
        })
        .collect()
}

fn encode_assignment(a: (usize, usize, usize)) -> [u8; 12] {
    let mut b = [0u8; 12];
    for (i, v) in [a.0, a.1, a.2].into_iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&(v as u32).to_le_bytes());
    }
    b
}

/// This rank's place after the split, and (on rank 0 only) every rank's leader.
struct Placement {
    new_rank: usize,
    new_size: usize,
    leader: usize,
    leaders: Vec<usize>,
}

/// Round 1.
fn agree(comm: &mut TcpComm, desc: &OpDesc, color: u32, key: u32) -> Result<Placement> {
    let net = &mut comm.net;
    let round = net.begin(desc)?;
    let mut mine = [0u8; 8];
    mine[..4].copy_from_slice(&color.to_le_bytes());
    mine[4..].copy_from_slice(&key.to_le_bytes());
    if net.rank != 0 {
        net.leaf_send(desc, round, &mine)?;
        let mut answer = [0u8; 12];
        net.leaf_receive(desc, round, LenRule::Exact(12), &mut answer)?;
        let field = |i| u32_at(&answer, i) as usize;
        return Ok(Placement {
            new_rank: field(0),
            new_size: field(4),
            leader: field(8),
            leaders: Vec::new(),
        });
    }
    let mut all = vec![0u8; net.size * 8];
    all[..8].copy_from_slice(&mine);
    net.gather(desc, round, &mut all, &|_, j| {
        Some((j.checked_mul(8)?, LenRule::Exact(8)))
    })?;
    let pairs: Vec<(u32, u32)> = (0..net.size)
        .map(|j| (u32_at(&all, j * 8), u32_at(&all, j * 8 + 4)))
        .collect();
    let assignment = assign(&pairs);
    let answers: Vec<[u8; 12]> = assignment.iter().copied().map(encode_assignment).collect();
    net.reply(desc, &|j| &answers[j])?;
    let (new_rank, new_size, leader) = assignment[0];
    Ok(Placement {
        new_rank,
        new_size,
        leader,
        leaders: assignment.iter().map(|a| a.2).collect(),
    })
}

/// Round 2: the leader's address for a non-leader, `None` for a leader.
fn exchange_addr(
    comm: &mut TcpComm,
    desc: &OpDesc,
    leaders: &[usize],
    mine: &[u8],
) -> Result<Vec<u8>> {
    let net = &mut comm.net;
    let round = net.begin(desc)?;
    if net.rank != 0 {
        net.leaf_send(desc, round, mine)?;
        let mut addr = [0u8; MAX_ADDR];
        let len = net.leaf_receive(desc, round, LenRule::AtMost(MAX_ADDR), &mut addr)?;
        return Ok(addr[..len].to_vec());
    }
    let mut all = vec![0u8; net.size * MAX_ADDR];
    all[..mine.len()].copy_from_slice(mine);
    let lens = net.gather(desc, round, &mut all, &|_, j| {
        Some((j.checked_mul(MAX_ADDR)?, LenRule::AtMost(MAX_ADDR)))
    })?;
    let text = |j: usize| {
        let len = if j == 0 { mine.len() } else { lens[j] };
        &all[j * MAX_ADDR..j * MAX_ADDR + len]
    };
    let leader_of = |j: usize| leaders.get(j).copied().unwrap_or(j);
    net.reply(desc, &|j| {
        if leader_of(j) == j {
            &[]
        } else {
            text(leader_of(j))
        }
    })?;
    Ok(if leader_of(0) == 0 {
        Vec::new()
    } else {
        text(leader_of(0)).to_vec()
    })
}

/// Splits `comm`'s group; returns this rank's endpoint of its colour's group.
pub(crate) fn split(comm: &mut TcpComm, desc: &OpDesc, color: u32, key: u32) -> Result<TcpComm> {
    let Placement {
        new_rank,
        new_size,
        leader,
        leaders,
    } = agree(comm, desc, color, key)?;
    let config = comm.net.config;
    let me = comm.net.rank;
    let listener = if leader == me && new_size > 1 {
        let ip = comm
            .net
            .links
            .first()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.ip())
            .ok_or_else(|| CommError::InvalidArgument {
                what: format!(
                    "split #{}: rank {me} has no link to take its address from",
                    desc.seq
                ),
            })?;
        Some(Listener::bind(&SocketAddr::new(ip, 0).to_string())?)
    } else {
        None
    };
    let mine = match &listener {
        Some(l) => l.local_addr()?.to_string().into_bytes(),
        None => Vec::new(),
    };
    let addr = exchange_addr(comm, desc, &leaders, &mine)?;
    match listener {
        Some(l) => l.accept_backend(new_size, config),
        None if new_size == 1 => TcpComm::new(0, 1, config, Vec::new()),
        None => {
            let addr = String::from_utf8(addr).map_err(|_| CommError::InvalidArgument {
                what: format!("split #{}: leader's address is not text", desc.seq),
            })?;
            join_backend(&addr, new_rank, new_size, config)
        }
    }
}
