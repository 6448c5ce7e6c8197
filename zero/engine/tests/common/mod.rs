//! A model whose operations are one closure, for engine tests that need no real network.

#![allow(dead_code)]

pub mod tiers;

use std::marker::PhantomData;
use zero::{Model, Op, OpUnits, Program};

/// Runs every operation through `F`.
pub struct FnModel<K, F>(F, PhantomData<K>);

impl<K, F> FnModel<K, F>
where
    F: FnMut(&K, &mut OpUnits<'_>) -> Result<(), zero::Error>,
{
    pub fn new(f: F) -> Self {
        Self(f, PhantomData)
    }
}

impl<K: std::fmt::Debug, F> Model for FnModel<K, F>
where
    F: FnMut(&K, &mut OpUnits<'_>) -> Result<(), zero::Error>,
{
    type Op = K;
    type Error = zero::Error;

    fn run(&mut self, op: &K, units: &mut OpUnits<'_>) -> Result<(), zero::Error> {
        (self.0)(op, units)
    }
}

/// A plain sequential model of `units` units: each unit's forward reads it, then in reverse
/// each unit's backward reads it and writes its gradient.
pub fn sequential(units: usize) -> Program<(bool, usize)> {
    let forward = (0..units).map(|u| Op::new((false, u)).reads([u]));
    let backward = (0..units)
        .rev()
        .map(|u| Op::new((true, u)).reads([u]).writes([u]));
    Program::new(forward.chain(backward).collect(), units).unwrap()
}
