//! A slot pool over registered workers (Flink's slot allocation with
//! `LocationPreferenceConstraint`, seed 004): each worker offers K slots;
//! a [`SlotRequest`] names the locations of its inputs, and the pool
//! picks the free slot closest to them — same worker, then same host,
//! then same rack, then anywhere — and says which level it achieved.
//!
//! With [`LocationConstraint::All`] a request waits until every input
//! has a location ([`SlotError::InputsNotPlaced`]); with
//! [`LocationConstraint::Any`] only the known locations count. As in
//! Flink, preferences are ignored when the inputs lie in more than
//! [`MAX_DISTINCT_LOCATIONS`] places (spread that wide, none is better).
//! Among equally close slots the pool takes the least used worker.

use std::collections::{BTreeMap, BTreeSet};

use crate::placement::Locality;
use crate::WorkerId;

/// Inputs spread over more distinct locations than this are ignored.
pub const MAX_DISTINCT_LOCATIONS: usize = 8;

/// Where an input lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// The worker holding it, when it is on one.
    pub worker: Option<WorkerId>,
    /// Its host.
    pub host: String,
    /// Its rack, when known.
    pub rack: Option<String>,
}

/// Whether a request must wait for all its inputs' locations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationConstraint {
    /// Every input must have a location.
    All,
    /// Consider the inputs that have one.
    Any,
}

/// A request for one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRequest {
    /// Each input's location, `None` while it is not placed.
    pub inputs: Vec<Option<Location>>,
    /// How to treat inputs without a location.
    pub constraint: LocationConstraint,
}

/// A slot given out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAssignment {
    /// The worker whose slot it is.
    pub worker: WorkerId,
    /// How close it is to the inputs.
    pub locality: Locality,
}

/// Why no slot was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// `All` and an input has no location yet.
    #[error("an input has no location yet and the request needs all of them")]
    InputsNotPlaced,
    /// Every slot is taken.
    #[error("no free slot")]
    NoFreeSlot,
    /// The worker is not in the pool.
    #[error("worker {0} is not in the slot pool")]
    UnknownWorker(WorkerId),
}

/// The pool (see the module docs).
#[derive(Debug, Default)]
pub struct SlotPool {
    workers: BTreeMap<WorkerId, PoolWorker>,
}

#[derive(Debug)]
struct PoolWorker {
    host: String,
    rack: Option<String>,
    slots: usize,
    used: usize,
}

// === impl SlotPool ===

impl SlotPool {
    /// An empty pool.
    pub fn new() -> SlotPool {
        SlotPool::default()
    }

    /// A worker registered with `slots` slots (replaces an earlier entry).
    pub fn add_worker(&mut self, id: WorkerId, host: String, rack: Option<String>, slots: usize) {
        self.workers.insert(
            id,
            PoolWorker {
                host,
                rack,
                slots,
                used: 0,
            },
        );
    }

    /// A worker left; returns how many of its slots were in use.
    pub fn remove_worker(&mut self, id: &WorkerId) -> Option<usize> {
        self.workers.remove(id).map(|w| w.used)
    }

    /// Whether the worker is in the pool.
    pub fn contains(&self, id: &WorkerId) -> bool {
        self.workers.contains_key(id)
    }

    /// Free slots over all workers.
    pub fn free_slots(&self) -> usize {
        self.workers.values().map(|w| w.slots - w.used).sum()
    }

    /// Slots over all workers.
    pub fn total_slots(&self) -> usize {
        self.workers.values().map(|w| w.slots).sum()
    }

    /// Where a worker is.
    pub fn location(&self, id: &WorkerId) -> Option<Location> {
        self.workers.get(id).map(|w| Location {
            worker: Some(id.clone()),
            host: w.host.clone(),
            rack: w.rack.clone(),
        })
    }

    /// Gives out the free slot closest to the request's inputs.
    pub fn allocate(&mut self, request: &SlotRequest) -> Result<SlotAssignment, SlotError> {
        if request.constraint == LocationConstraint::All
            && request.inputs.iter().any(Option::is_none)
        {
            return Err(SlotError::InputsNotPlaced);
        }
        let mut locations: Vec<&Location> = request.inputs.iter().flatten().collect();
        let distinct: BTreeSet<&Location> = locations.iter().copied().collect();
        if distinct.len() > MAX_DISTINCT_LOCATIONS {
            locations.clear();
        }
        // Score: how many inputs each candidate is local / host-local /
        // rack-local to; compared in that order, then the least used.
        let mut best: Option<(&WorkerId, (usize, usize, usize), f64)> = None;
        for (id, w) in &self.workers {
            if w.used >= w.slots {
                continue;
            }
            let local = locations
                .iter()
                .filter(|l| l.worker.as_ref() == Some(id))
                .count();
            let host = locations.iter().filter(|l| l.host == w.host).count();
            let rack = locations
                .iter()
                .filter(|l| l.rack.is_some() && l.rack == w.rack)
                .count();
            let utilization = w.used as f64 / w.slots.max(1) as f64;
            let better = match &best {
                None => true,
                Some((_, score, util)) => {
                    (local, host, rack) > *score
                        || ((local, host, rack) == *score && utilization < *util)
                }
            };
            if better {
                best = Some((id, (local, host, rack), utilization));
            }
        }
        let Some((id, (local, host, rack), _)) = best else {
            return Err(SlotError::NoFreeSlot);
        };
        let locality = if local > 0 {
            Locality::Local
        } else if host > 0 {
            Locality::Host
        } else if rack > 0 {
            Locality::Rack
        } else {
            Locality::Any
        };
        let id = id.clone();
        if let Some(w) = self.workers.get_mut(&id) {
            w.used += 1;
        }
        Ok(SlotAssignment {
            worker: id,
            locality,
        })
    }

    /// Returns a slot of `worker` to the pool.
    pub fn free(&mut self, worker: &WorkerId) -> Result<(), SlotError> {
        let w = self
            .workers
            .get_mut(worker)
            .ok_or_else(|| SlotError::UnknownWorker(worker.clone()))?;
        w.used = w.used.saturating_sub(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(worker: Option<&str>, host: &str, rack: &str) -> Option<Location> {
        Some(Location {
            worker: worker.map(WorkerId::new),
            host: host.into(),
            rack: Some(rack.into()),
        })
    }

    fn pool() -> SlotPool {
        let mut pool = SlotPool::new();
        pool.add_worker(WorkerId::new("w1"), "h1".into(), Some("r0".into()), 2);
        pool.add_worker(WorkerId::new("w2"), "h1".into(), Some("r0".into()), 2);
        pool.add_worker(WorkerId::new("w3"), "h2".into(), Some("r0".into()), 2);
        pool.add_worker(WorkerId::new("w4"), "h3".into(), Some("r1".into()), 2);
        pool
    }

    fn any(inputs: Vec<Option<Location>>) -> SlotRequest {
        SlotRequest {
            inputs,
            constraint: LocationConstraint::Any,
        }
    }

    #[test]
    fn same_worker_then_host_then_rack_then_anywhere() {
        let mut pool = pool();
        let req = any(vec![at(Some("w2"), "h1", "r0")]);
        let a = pool.allocate(&req).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w2", Locality::Local));
        let a = pool.allocate(&req).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w2", Locality::Local));
        // w2 is full: its host-mate w1.
        let a = pool.allocate(&req).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w1", Locality::Host));
        pool.allocate(&req).unwrap();
        // h1 is full: rack r0 (w3).
        let a = pool.allocate(&req).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w3", Locality::Rack));
        pool.allocate(&req).unwrap();
        let a = pool.allocate(&req).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w4", Locality::Any));
        pool.allocate(&req).unwrap();
        assert_eq!(pool.allocate(&req), Err(SlotError::NoFreeSlot));
        pool.free(&WorkerId::new("w3")).unwrap();
        assert_eq!(pool.allocate(&req).unwrap().locality, Locality::Rack);
    }

    #[test]
    fn all_waits_for_every_input_and_any_uses_the_known_ones() {
        let mut pool = pool();
        let inputs = vec![None, at(None, "h3", "r1")];
        let all = SlotRequest {
            inputs: inputs.clone(),
            constraint: LocationConstraint::All,
        };
        assert_eq!(pool.allocate(&all), Err(SlotError::InputsNotPlaced));
        let a = pool.allocate(&any(inputs)).unwrap();
        assert_eq!((a.worker.as_str(), a.locality), ("w4", Locality::Host));
    }

    #[test]
    fn the_host_with_most_inputs_wins() {
        let mut pool = pool();
        let req = any(vec![
            at(None, "h2", "r0"),
            at(None, "h3", "r1"),
            at(None, "h3", "r1"),
        ]);
        assert_eq!(pool.allocate(&req).unwrap().worker.as_str(), "w4");
    }

    #[test]
    fn widely_spread_inputs_are_ignored_and_load_is_spread() {
        let mut pool = pool();
        let inputs: Vec<_> = (0..9).map(|i| at(None, &format!("x{i}"), "r9")).collect();
        let mut used = BTreeSet::new();
        for _ in 0..4 {
            let a = pool.allocate(&any(inputs.clone())).unwrap();
            assert_eq!(a.locality, Locality::Any);
            used.insert(a.worker);
        }
        assert_eq!(used.len(), 4, "one slot on each worker before any second");
        assert_eq!(pool.remove_worker(&WorkerId::new("w1")), Some(1));
        assert_eq!(pool.free_slots(), 3);
    }
}
