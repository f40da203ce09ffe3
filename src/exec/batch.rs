//! Auto-batching's policy (BATCHSIZE / MINBATCHSIZE / MINBATCHTIMEOUT): which queued requests a worker takes
//! next, alone or together. Pure: it sees queued items through `Queued`, so its unit tests need no model;
//! `run::step_batch` and `op::run_batch` run a batch. It runs under the queue's lock: lock order is always queue, then run state
//! (`Entry::batch_key` takes the run's lock inside the queue's), never the other way round.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::model::BatchOpts;
use crate::tensor::DataType;

/// What a worker takes off its queue.
pub enum Work<E> {
    One(E),
    Batch(Vec<E>),
}

/// A batchable request: requests with the same `model` (the same object) and `layout` can run together.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchKey {
    /// The model's identity (its `Arc`'s address): only requests to the very same model object are joined.
    pub model: usize,
    pub opts: BatchOpts,
    /// Per input: dtype and every dimension but the first.
    pub layout: Vec<(DataType, Vec<i64>)>,
    /// Dimension 0 of the inputs.
    pub rows: u64,
}

impl BatchKey {
    pub fn compatible(&self, other: &BatchKey) -> bool {
        self.model == other.model && self.layout == other.layout
    }
}

/// What the policy needs to know of a queued request.
pub trait Queued {
    /// `Some` if its next op is a batchable model run whose inputs are ready.
    fn batch_key(&self) -> Option<BatchKey>;
    /// Its own TIMEOUT deadline, if any.
    fn deadline(&self) -> Option<Instant>;
    /// When it was queued (MINBATCHTIMEOUT counts from the first request of a batch).
    fn queued_at(&self) -> Instant;
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// Picks the next work in queue order (RedisAI's `_BGThread_BatchOperations`): an entry that is not a
/// batchable model run is taken alone; a batchable one is joined by the compatible entries behind it
/// (same model object, same input types and trailing dimensions) until BATCHSIZE is reached. A batch
/// short of MINBATCHSIZE waits, unless MINBATCHTIMEOUT has passed since its first request was queued;
/// the returned instant says when to look again.
pub fn take_work<E: Queued>(q: &mut VecDeque<E>, now: Instant) -> (Option<Work<E>>, Option<Instant>) {
    let mut keys: Vec<Option<Option<BatchKey>>> = (0..q.len()).map(|_| None).collect();
    let mut wake_at = None;
    for i in 0..q.len() {
        let key = keys[i].get_or_insert_with(|| q[i].batch_key()).take();
        let Some(key) = key else { return (q.remove(i).map(Work::One), None) };
        let b = key.opts;
        if key.rows == 0 || key.rows >= b.size {
            return (q.remove(i).map(Work::One), None);
        }
        let mut members = vec![i];
        let mut total = key.rows;
        for j in i + 1..q.len() {
            if total >= b.size {
                break;
            }
            let other = keys[j].get_or_insert_with(|| q[j].batch_key());
            if let Some(k) = other.as_ref().filter(|k| key.compatible(k)) {
                members.push(j);
                total += k.rows;
            }
        }
        // A member whose own TIMEOUT passed leaves alone (its step replies TIMEDOUT).
        if let Some(&late) = members.iter().find(|&&m| q[m].deadline().is_some_and(|d| now > d)) {
            return (q.remove(late).map(Work::One), None);
        }
        let first_queued = q[i].queued_at();
        let min_timeout = Duration::from_millis(b.min_timeout_ms);
        if b.min_size == 0 || total >= b.min_size || (b.min_timeout_ms > 0 && now >= first_queued + min_timeout) {
            let batch: Vec<E> = members.iter().rev().filter_map(|&m| q.remove(m)).collect();
            return (Some(Work::Batch(batch.into_iter().rev().collect())), None);
        }
        if b.min_timeout_ms > 0 {
            wake_at = earliest(wake_at, first_queued + min_timeout);
        }
        for &m in &members {
            if let Some(d) = q[m].deadline() {
                wake_at = earliest(wake_at, d + Duration::from_millis(1));
            }
        }
    }
    (None, wake_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Req {
        id: u32,
        key: Option<BatchKey>,
        deadline: Option<Instant>,
        queued_at: Instant,
    }

    impl Queued for Req {
        fn batch_key(&self) -> Option<BatchKey> {
            self.key.clone()
        }
        fn deadline(&self) -> Option<Instant> {
            self.deadline
        }
        fn queued_at(&self) -> Instant {
            self.queued_at
        }
    }

    fn key(model: usize, size: u64, min_size: u64, min_timeout_ms: u64, rows: u64) -> Option<BatchKey> {
        Some(BatchKey {
            model,
            opts: BatchOpts { size, min_size, min_timeout_ms },
            layout: vec![(DataType::Float, vec![4])],
            rows,
        })
    }

    fn queue(items: Vec<(u32, Option<BatchKey>)>, at: Instant) -> VecDeque<Req> {
        items.into_iter().map(|(id, key)| Req { id, key, deadline: None, queued_at: at }).collect()
    }

    fn ids(w: Option<Work<Req>>) -> Vec<u32> {
        match w {
            Some(Work::One(r)) => vec![r.id],
            Some(Work::Batch(rs)) => rs.into_iter().map(|r| r.id).collect(),
            None => vec![],
        }
    }

    #[test]
    fn unbatched_requests_go_alone_in_order() {
        let now = Instant::now();
        let mut q = queue(vec![(1, None), (2, key(7, 4, 0, 0, 1))], now);
        assert_eq!(ids(take_work(&mut q, now).0), vec![1]);
    }

    #[test]
    fn compatible_requests_join_up_to_batchsize() {
        let now = Instant::now();
        let mut other = key(7, 4, 0, 0, 1);
        if let Some(k) = other.as_mut() {
            k.layout = vec![(DataType::Float, vec![5])];
        }
        let mut q = queue(
            vec![
                (1, key(7, 4, 0, 0, 1)),
                (2, key(8, 4, 0, 0, 1)),
                (3, other),
                (4, key(7, 4, 0, 0, 2)),
                (5, key(7, 4, 0, 0, 2)),
            ],
            now,
        );
        // Joined while the batch is short of BATCHSIZE (4): 1 and 4 make 3 rows, so 5 joins too (RedisAI's rule:
        // the last member may take the batch past BATCHSIZE).
        assert_eq!(ids(take_work(&mut q, now).0), vec![1, 4, 5]);
        assert_eq!(q.iter().map(|r| r.id).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn a_request_as_big_as_batchsize_goes_alone() {
        let now = Instant::now();
        let mut q = queue(vec![(1, key(7, 4, 0, 0, 4)), (2, key(7, 4, 0, 0, 1))], now);
        assert_eq!(ids(take_work(&mut q, now).0), vec![1]);
    }

    #[test]
    fn short_of_minbatchsize_waits_until_minbatchtimeout() {
        let t0 = Instant::now();
        let mut q = queue(vec![(1, key(7, 8, 4, 50, 1)), (2, key(7, 8, 4, 50, 1))], t0);
        let (work, wake) = take_work(&mut q, t0);
        assert!(work.is_none());
        assert_eq!(wake, Some(t0 + Duration::from_millis(50)));
        assert_eq!(ids(take_work(&mut q, t0 + Duration::from_millis(50)).0), vec![1, 2]);
    }

    #[test]
    fn minbatchsize_without_timeout_waits_for_more() {
        let t0 = Instant::now();
        let mut q = queue(vec![(1, key(7, 8, 3, 0, 1)), (2, key(7, 8, 3, 0, 1))], t0);
        let (work, wake) = take_work(&mut q, t0 + Duration::from_secs(60));
        assert!(work.is_none() && wake.is_none());
        q.push_back(Req { id: 3, key: key(7, 8, 3, 0, 1), deadline: None, queued_at: t0 });
        assert_eq!(ids(take_work(&mut q, t0).0), vec![1, 2, 3]);
    }

    #[test]
    fn a_member_past_its_timeout_leaves_alone() {
        let t0 = Instant::now();
        let mut q = queue(vec![(1, key(7, 8, 4, 0, 1)), (2, key(7, 8, 4, 0, 1))], t0);
        q[1].deadline = Some(t0);
        assert_eq!(ids(take_work(&mut q, t0 + Duration::from_millis(1)).0), vec![2]);
    }
}
