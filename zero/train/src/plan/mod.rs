//! A run's memory and traffic worked out before anything is allocated: what one rank's arena
//! must hold and what fits a cap ([`memory_fit`]), and `zero-train plan`'s table of every
//! stage ([`plan_report`]) priced at a link rate ([`link_rate`]).

pub mod link_rate;
pub mod memory_fit;
pub mod plan_report;
pub mod tp_traffic;
