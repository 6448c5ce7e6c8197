//! The stream-ordered flight's bookkeeping on a host arena, with a fake work that records
//! what the protocol asked of it and in which state it found the block.

use super::*;
use crate::collectives::Flight;
use crate::Error;

type Log = Rc<RefCell<Vec<String>>>;

/// A collective that finishes after `polls_left` more polls, or fails when polled.
struct Fake {
    id: usize,
    block: Handle,
    polls_left: u32,
    fails: bool,
    order_fails: bool,
    log: Log,
}

impl Fake {
    fn new(id: usize, block: Handle, polls_left: u32, log: &Log) -> Self {
        Self {
            id,
            block,
            polls_left,
            fails: false,
            order_fails: false,
            log: Rc::clone(log),
        }
    }
}

fn failure(id: usize) -> Error {
    Error::Order(format!("fake collective {id} failed"))
}

impl StreamWork for Fake {
    fn order_before_arena(&self, arena: &Arena) -> Result<()> {
        // A pinned block refuses to be viewed: the protocol orders before it unpins.
        let pinned = arena.slice::<u8>(self.block).is_err();
        self.log
            .borrow_mut()
            .push(format!("order {} pinned={pinned}", self.id));
        if self.order_fails {
            return Err(failure(self.id));
        }
        Ok(())
    }

    fn poll(mut self) -> Result<Option<Self>> {
        self.log.borrow_mut().push(format!("poll {}", self.id));
        if self.fails {
            return Err(failure(self.id));
        }
        if self.polls_left == 0 {
            return Ok(None);
        }
        self.polls_left -= 1;
        Ok(Some(self))
    }

    fn wait(self) -> Result<()> {
        self.log.borrow_mut().push(format!("wait {}", self.id));
        if self.fails {
            return Err(failure(self.id));
        }
        Ok(())
    }
}

/// A host arena with `n` pinned blocks, as a launch leaves them.
fn pinned_blocks(n: usize) -> (Arena, Vec<Handle>) {
    let mut arena = Arena::host(4096).unwrap();
    let blocks = (0..n)
        .map(|_| {
            let block = arena.alloc(64).unwrap();
            arena.pin(block).unwrap();
            block
        })
        .collect();
    (arena, blocks)
}

fn flight(work: Fake, unsettled: &Unsettled<Fake>) -> Flight {
    Flight::new(StreamFlight::new(work.block, work, unsettled.clone()))
}

fn entries(log: &Log) -> Vec<String> {
    log.borrow().clone()
}

#[test]
fn landing_orders_the_arena_while_pinned_then_unpins_without_waiting() {
    let (mut arena, blocks) = pinned_blocks(1);
    let log = Log::default();
    let unsettled = Unsettled::new();
    let landed = flight(Fake::new(0, blocks[0], 3, &log), &unsettled)
        .land(&mut arena)
        .unwrap();
    assert_eq!(landed, blocks[0]);
    assert_eq!(entries(&log), ["order 0 pinned=true", "poll 0"]);
    assert!(
        arena.slice::<u8>(landed).is_ok(),
        "landing unpins the block"
    );
    assert_eq!(
        unsettled.len(),
        1,
        "a running collective is kept to be settled"
    );
}

#[test]
fn a_collective_finished_at_landing_is_not_kept() {
    let (mut arena, blocks) = pinned_blocks(1);
    let log = Log::default();
    let unsettled = Unsettled::new();
    flight(Fake::new(0, blocks[0], 0, &log), &unsettled)
        .land(&mut arena)
        .unwrap();
    assert_eq!(unsettled.len(), 0);
}

#[test]
fn a_failure_seen_at_landing_is_returned_and_the_block_unpinned() {
    let (mut arena, blocks) = pinned_blocks(1);
    let log = Log::default();
    let mut work = Fake::new(7, blocks[0], 0, &log);
    work.fails = true;
    let err = flight(work, &Unsettled::new())
        .land(&mut arena)
        .unwrap_err();
    assert!(err.to_string().contains("fake collective 7"), "{err}");
    assert!(arena.slice::<u8>(blocks[0]).is_ok());
}

#[test]
fn when_the_arena_cannot_be_ordered_landing_waits_on_the_host_first() {
    let (mut arena, blocks) = pinned_blocks(1);
    let log = Log::default();
    let mut work = Fake::new(0, blocks[0], 5, &log);
    work.order_fails = true;
    assert!(flight(work, &Unsettled::new()).land(&mut arena).is_err());
    assert_eq!(entries(&log), ["order 0 pinned=true", "wait 0"]);
    assert!(arena.slice::<u8>(blocks[0]).is_ok());
}

#[test]
fn settling_polls_every_kept_collective_and_drops_the_finished_ones() {
    let (mut arena, blocks) = pinned_blocks(3);
    let log = Log::default();
    let unsettled = Unsettled::new();
    // Still running after landing's poll: 0 finishes at the next poll, 1 and 2 later.
    for (id, polls) in [(0, 1), (1, 2), (2, 3)] {
        flight(Fake::new(id, blocks[id], polls, &log), &unsettled)
            .land(&mut arena)
            .unwrap();
    }
    log.borrow_mut().clear();
    unsettled.poll().unwrap();
    assert_eq!(entries(&log), ["poll 0", "poll 1", "poll 2"]);
    assert_eq!(unsettled.len(), 2);
    log.borrow_mut().clear();
    unsettled.wait_all().unwrap();
    assert_eq!(entries(&log), ["wait 1", "wait 2"], "oldest first");
    assert_eq!(unsettled.len(), 0);
}

#[test]
fn a_kept_collective_that_fails_is_reported_by_the_next_poll() {
    let unsettled = Unsettled::new();
    let log = Log::default();
    let (_arena, blocks) = pinned_blocks(1);
    let mut work = Fake::new(4, blocks[0], 1, &log);
    work.fails = true;
    unsettled.push(work);
    let err = unsettled.poll().unwrap_err();
    assert!(err.to_string().contains("fake collective 4"), "{err}");
}

#[test]
fn dropping_an_unlanded_flight_waits_and_leaves_the_block_pinned() {
    let (mut arena, blocks) = pinned_blocks(1);
    let log = Log::default();
    drop(flight(Fake::new(0, blocks[0], 9, &log), &Unsettled::new()));
    assert_eq!(entries(&log), ["wait 0"]);
    assert!(
        arena.free(blocks[0]).is_err(),
        "the arena must not reuse a block a dropped collective wrote"
    );
}
