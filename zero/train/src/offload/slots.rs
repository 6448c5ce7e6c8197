//! The arena's staging slots and what each holds: free, fetched (holding a segment copied
//! back from host), or out on a queued job (then held by the job, not here).

/// Staging slots (of type `S`: host or device memory) not out on a job, and the fetches queued.
#[derive(Debug)]
pub(super) struct StagingSlots<S> {
    free: Vec<S>,
    /// Slots holding a fetched segment, oldest first.
    fetched: Vec<(usize, S)>,
    /// Fetches queued and not yet completed: (segment, id).
    fetching: Vec<(usize, u64)>,
    next_fetch: u64,
}

impl<S> StagingSlots<S> {
    /// All of `slots` free.
    pub(super) fn new(slots: Vec<S>) -> Self {
        Self {
            free: slots,
            fetched: Vec::new(),
            fetching: Vec::new(),
            next_fetch: 0,
        }
    }

    pub(super) fn pop_free(&mut self) -> Option<S> {
        self.free.pop()
    }

    pub(super) fn release(&mut self, slot: S) {
        self.free.push(slot);
    }

    /// The oldest fetched slot (its segment stays on host and can be fetched again).
    pub(super) fn take_oldest_fetched(&mut self) -> Option<S> {
        (!self.fetched.is_empty()).then(|| self.fetched.remove(0).1)
    }

    /// The slot a completed fetch of `segment` filled, if there is one.
    pub(super) fn take_fetched(&mut self, segment: usize) -> Option<S> {
        let at = self.fetched.iter().position(|&(s, _)| s == segment)?;
        Some(self.fetched.remove(at).1)
    }

    /// Forgets fetches of `segment`'s previous input (stale after a new keep), freeing
    /// the slots that hold one.
    pub(super) fn forget(&mut self, segment: usize) {
        self.fetching.retain(|&(s, _)| s != segment);
        while let Some(slot) = self.take_fetched(segment) {
            self.free.push(slot);
        }
    }

    /// A fetch of `segment` is queued or done and not yet restored.
    pub(super) fn fetch_pending(&self, segment: usize) -> bool {
        self.fetched.iter().any(|&(s, _)| s == segment)
            || self.fetching.iter().any(|&(s, _)| s == segment)
    }

    /// A new fetch id.
    pub(super) fn next_fetch_id(&mut self) -> u64 {
        let id = self.next_fetch;
        self.next_fetch += 1;
        id
    }

    /// Records that fetch `id` of `segment` was queued.
    pub(super) fn fetch_queued(&mut self, segment: usize, id: u64) {
        self.fetching.push((segment, id));
    }

    /// Files the slot a completed job handed back: fetched when it is a fetch still
    /// wanted, free otherwise (a copy to host, or a fetch a later keep made stale).
    pub(super) fn file_completed(&mut self, segment: usize, slot: S, fetch: Option<u64>) {
        let current = fetch.and_then(|id| {
            let at = self.fetching.iter().position(|&(_, f)| f == id)?;
            Some(self.fetching.remove(at))
        });
        match current {
            Some(_) => self.fetched.push((segment, slot)),
            None => self.free.push(slot),
        }
    }
}
