//! Cycles and nesting depth of a model's call graph: TF library functions, TFLITE subgraphs, ONNX model-local
//! functions. Every backend expands a call by recursing into the callee (TensorFlow instantiating and inlining
//! functions, LiteRT preparing a control-flow op's subgraphs, ONNX Runtime inlining local functions and
//! inferring their shapes), so a function that reaches itself recurses until the stack overflows and takes
//! Redis down with it, and a long enough chain does the same. The walk here is iterative (an explicit stack,
//! never recursion on untrusted input), visits each node and edge once, and stops at the bound.
//!
//! Depth is not all: a function that calls the next one twice, 24 levels deep, is a few KB that the backend
//! expands into 2^24 calls (minutes of shape inference or inlining, on Redis's main thread at RESTORE).
//! `inlined` gives what each node's calls bring in when expanded in place, which each backend bounds.

/// A call graph over nodes `0..n`.
pub(crate) struct CallGraph {
    /// The levels a node uses by itself (≥ 1: its own body).
    base: Vec<u32>,
    /// What a node holds by itself (its nodes or ops), for `inlined`.
    weight: Vec<u64>,
    /// `(callee, level)`: the call sits `level` (≥ 1) levels into the caller, so the callee's body begins
    /// `level` levels below the caller's.
    calls: Vec<Vec<(usize, u32)>>,
}

/// Whether calls stay within a bound once expanded (`CallGraph::expansion`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Expansion {
    Fits,
    /// The calls of this node bring in more than the bound (the first such node in index order).
    Node(usize),
    /// The calls of the root (the model's or graph's own body, outside the call graph) do.
    Root,
}

/// Why a call graph is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `path[0]` reaches itself: `path[0] -> path[1] -> ... -> path[0]` (the last entry repeats the first).
    Cycle(Vec<usize>),
    /// Calls from this node nest deeper than the bound.
    TooDeep(usize),
}

impl CallGraph {
    pub(crate) fn new(n: usize) -> CallGraph {
        CallGraph { base: vec![1; n], weight: vec![0; n], calls: vec![Vec::new(); n] }
    }

    pub(crate) fn len(&self) -> usize {
        self.base.len()
    }

    /// `caller` calls `callee` from `level` levels into its body (a flat call: 1).
    pub(crate) fn call(&mut self, caller: usize, callee: usize, level: u32) {
        self.calls[caller].push((callee, level.max(1)));
    }

    /// `node` uses `levels` levels by itself (nested bodies that call nothing).
    pub(crate) fn uses(&mut self, node: usize, levels: u32) {
        self.base[node] = self.base[node].max(levels);
    }

    /// `node` holds `size` by itself (nodes or ops of its body, calls included).
    pub(crate) fn weigh(&mut self, node: usize, size: u64) {
        self.weight[node] = self.weight[node].saturating_add(size);
    }

    /// What every node's calls bring in when expanded in place: the sum over its calls of the callee's own
    /// size and what the callee's calls bring in (each call counted as often as it is made, saturating). A
    /// node's own size is left out, so that a large model without calls is never refused for its size. Needs
    /// the `heights` of an acyclic graph: a callee is lower than its caller, so going up by height finds every
    /// callee done. Linear in nodes and calls (plus the sort), whatever the expansion.
    fn inlined(&self, heights: &[u32]) -> Vec<u64> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by_key(|&v| heights[v]);
        let mut inlined = vec![0u64; self.len()];
        for v in order {
            inlined[v] = self.calls[v].iter().fold(0u64, |sum, &(callee, _)| {
                sum.saturating_add(self.weight[callee]).saturating_add(inlined[callee])
            });
        }
        inlined
    }

    /// What calling `callee` once brings in: its own size and what its calls bring in.
    fn call_size(&self, inlined: &[u64], callee: usize) -> u64 {
        self.weight[callee].saturating_add(inlined[callee])
    }

    /// Whether every node's calls, and the root's (`root_calls`: the callees of a body outside the graph, once
    /// per call), bring in at most `max` once expanded (`inlined`; `heights` of the acyclic graph).
    pub(crate) fn expansion(
        &self,
        heights: &[u32],
        root_calls: impl IntoIterator<Item = usize>,
        max: u64,
    ) -> Expansion {
        let inlined = self.inlined(heights);
        if let Some(v) = (0..self.len()).find(|&v| inlined[v] > max) {
            return Expansion::Node(v);
        }
        let root = root_calls.into_iter().fold(0u64, |sum, f| sum.saturating_add(self.call_size(&inlined, f)));
        if root > max {
            Expansion::Root
        } else {
            Expansion::Fits
        }
    }

    /// The height of every node (the levels it spans with everything it calls), or the first cycle or node
    /// deeper than `max` found, roots taken in index order. Nodes no one calls are checked too: a backend
    /// may expand them (TensorFlow validates its whole library, LiteRT may prepare any subgraph).
    pub(crate) fn heights(&self, max: u32) -> Result<Vec<u32>, Refusal> {
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            New,
            OnStack,
            Done(u32),
        }
        let mut state = vec![State::New; self.len()];
        // (node, next call to look at, height so far)
        let mut stack: Vec<(usize, usize, u32)> = Vec::new();
        for root in 0..self.len() {
            if state[root] != State::New {
                continue;
            }
            state[root] = State::OnStack;
            stack.push((root, 0, self.base[root]));
            while let Some(top) = stack.last_mut() {
                let (node, next, height) = *top;
                if let Some(&(callee, level)) = self.calls[node].get(next) {
                    top.1 += 1;
                    match state[callee] {
                        State::OnStack => {
                            let from = stack.iter().position(|&(n, _, _)| n == callee).unwrap_or(0);
                            let mut path: Vec<usize> = stack[from..].iter().map(|&(n, _, _)| n).collect();
                            path.push(callee);
                            return Err(Refusal::Cycle(path));
                        }
                        State::Done(h) => top.2 = height.max(level.saturating_add(h)),
                        State::New => {
                            // Every call adds at least one level: a stack deeper than `max` is a chain that
                            // deep, so the walk (and its memory) stops at the bound.
                            if stack.len() >= max as usize {
                                return Err(Refusal::TooDeep(stack[0].0));
                            }
                            state[callee] = State::OnStack;
                            stack.push((callee, 0, self.base[callee]));
                        }
                    }
                } else {
                    stack.pop();
                    if height > max {
                        return Err(Refusal::TooDeep(stack.first().map_or(node, |&(n, _, _)| n)));
                    }
                    state[node] = State::Done(height);
                    if let Some(parent) = stack.last_mut() {
                        let level = self.calls[parent.0][parent.1 - 1].1;
                        parent.2 = parent.2.max(level.saturating_add(height));
                    }
                }
            }
        }
        Ok(state.iter().map(|s| if let State::Done(h) = s { *h } else { 0 }).collect())
    }
}

/// `a -> b -> a` for an error reply: at most 8 names (a cycle or chain can be as long as the bound).
pub(crate) fn show_path(path: &[usize], name: impl Fn(usize) -> String) -> String {
    const MAX: usize = 8;
    let mut parts: Vec<String> = Vec::new();
    for (i, &n) in path.iter().enumerate() {
        if path.len() > MAX && i == MAX - 2 {
            parts.push("...".into());
        }
        if path.len() <= MAX || i < MAX - 2 || i == path.len() - 1 {
            parts.push(name(n));
        }
    }
    parts.join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn graph(n: usize, edges: &[(usize, usize)]) -> CallGraph {
        let mut g = CallGraph::new(n);
        for &(a, b) in edges {
            g.call(a, b, 1);
        }
        g
    }

    #[test]
    fn cycles_are_found_with_their_path() {
        assert_eq!(graph(1, &[(0, 0)]).heights(32), Err(Refusal::Cycle(vec![0, 0])));
        assert_eq!(graph(2, &[(0, 1), (1, 0)]).heights(32), Err(Refusal::Cycle(vec![0, 1, 0])));
        // a cycle not through the root
        assert_eq!(graph(4, &[(0, 1), (1, 2), (2, 3), (3, 1)]).heights(32), Err(Refusal::Cycle(vec![1, 2, 3, 1])));
        // a diamond is no cycle
        assert_eq!(graph(4, &[(0, 1), (0, 2), (1, 3), (2, 3)]).heights(32), Ok(vec![3, 2, 2, 1]));
    }

    #[test]
    fn depth_counts_levels() {
        let chain = |n: usize| graph(n, &(1..n).map(|i| (i - 1, i)).collect::<Vec<_>>());
        assert_eq!(chain(32).heights(32).map(|h| h[0]), Ok(32));
        assert_eq!(chain(33).heights(32), Err(Refusal::TooDeep(0)));
        // a chain whose tail comes first in index order: found through the memoised heights
        let reversed = |n: usize| graph(n, &(1..n).map(|i| (i, i - 1)).collect::<Vec<_>>());
        assert_eq!(reversed(32).heights(32).map(|h| h[31]), Ok(32));
        assert_eq!(reversed(40).heights(32), Err(Refusal::TooDeep(32)));
        // weighted calls and a node's own levels
        let mut g = CallGraph::new(2);
        g.call(0, 1, 10);
        g.uses(1, 5);
        assert_eq!(g.heights(15), Ok(vec![15, 5]));
        assert_eq!(g.heights(14), Err(Refusal::TooDeep(0)));
        // far deeper than the bound: stops there (no recursion, no memory past it)
        assert_eq!(chain(200_000).heights(32), Err(Refusal::TooDeep(0)));
    }

    #[test]
    fn expansion_counts_every_call() {
        // a fan-out: each of 40 levels calls the next twice (2^40 leaves from 80 calls)
        let n = 40;
        let mut g = CallGraph::new(n);
        for i in 0..n {
            g.weigh(i, 3);
            if i + 1 < n {
                g.call(i, i + 1, 1);
                g.call(i, i + 1, 1);
            }
        }
        let inlined = g.inlined(&g.heights(64).unwrap());
        assert_eq!(inlined[n - 1], 0);
        assert_eq!(inlined[n - 2], 2 * 3);
        assert_eq!(g.call_size(&inlined, 0), 3 * ((1u64 << n) - 1));
        // a diamond counts the shared callee once per path; a node's own size is not counted
        let mut d = graph(4, &[(0, 1), (0, 2), (1, 3), (2, 3)]);
        (0..4).for_each(|v| d.weigh(v, 1));
        d.weigh(0, 1000);
        assert_eq!(d.inlined(&d.heights(8).unwrap()), vec![4, 1, 1, 0]);
        // the bound: a node's calls first, then the root's
        assert_eq!(d.expansion(&d.heights(8).unwrap(), [], 4), Expansion::Fits);
        assert_eq!(d.expansion(&d.heights(8).unwrap(), [], 3), Expansion::Node(0));
        assert_eq!(d.expansion(&d.heights(8).unwrap(), [1, 2], 4), Expansion::Fits);
        assert_eq!(d.expansion(&d.heights(8).unwrap(), [1, 2, 1], 4), Expansion::Root);
        // saturates instead of overflowing
        let mut wide = CallGraph::new(2);
        wide.weigh(1, u64::MAX / 2);
        (0..3).for_each(|_| wide.call(0, 1, 1));
        assert_eq!(wide.inlined(&wide.heights(8).unwrap())[0], u64::MAX);
    }

    #[test]
    fn paths_are_shortened() {
        let name = |n: usize| n.to_string();
        assert_eq!(show_path(&[0, 1, 0], name), "0 -> 1 -> 0");
        assert_eq!(show_path(&(0..8).collect::<Vec<_>>(), name), "0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7");
        assert_eq!(show_path(&(0..20).collect::<Vec<_>>(), name), "0 -> 1 -> 2 -> 3 -> 4 -> 5 -> ... -> 19");
    }

    /// The reference: reachability by brute force (small graphs), longest chain by memoised recursion over an
    /// acyclic graph (trusted input, tests only).
    fn reference(n: usize, edges: &[(usize, usize)]) -> (bool, u32) {
        let reach = |from: usize| {
            let mut seen = vec![false; n];
            let mut todo = vec![from];
            while let Some(v) = todo.pop() {
                for &(a, b) in edges {
                    if a == v && !seen[b] {
                        seen[b] = true;
                        todo.push(b);
                    }
                }
            }
            seen
        };
        if (0..n).any(|v| reach(v)[v]) {
            return (true, 0);
        }
        fn height(v: usize, edges: &[(usize, usize)], memo: &mut Vec<Option<u32>>) -> u32 {
            if let Some(h) = memo[v] {
                return h;
            }
            let h = 1 + edges.iter().filter(|e| e.0 == v).map(|e| height(e.1, edges, memo)).max().unwrap_or(0);
            memo[v] = Some(h);
            h
        }
        let mut memo = vec![None; n];
        (false, (0..n).map(|v| height(v, edges, &mut memo)).max().unwrap_or(0))
    }

    proptest! {
        #![proptest_config(crate::commands::fuzz::config())]

        /// Random graphs (a chain to get deep ones, plus random calls): terminates, never panics, refuses
        /// exactly the cyclic ones and those deeper than the bound.
        #[test]
        fn random_graphs(chain in 0usize..40, extra in proptest::collection::vec((0usize..48, 0usize..48), 0..24),
                         max in 1u32..40) {
            let n = chain.max(1) + 8;
            let mut edges: Vec<(usize, usize)> = (1..chain).map(|i| (i - 1, i)).collect();
            edges.extend(extra.iter().map(|&(a, b)| (a % n, b % n)));
            let (cyclic, deepest) = reference(n, &edges);
            match graph(n, &edges).heights(max) {
                Err(Refusal::Cycle(path)) => {
                    prop_assert!(cyclic);
                    prop_assert_eq!(path.first(), path.last());
                    for w in path.windows(2) {
                        prop_assert!(edges.contains(&(w[0], w[1])), "{:?} not an edge", w);
                    }
                }
                // a cycle longer than the bound may be reported as depth: either way refused
                Err(Refusal::TooDeep(_)) => prop_assert!(cyclic || deepest > max),
                Ok(h) => {
                    prop_assert!(!cyclic && deepest <= max);
                    prop_assert_eq!(h.iter().copied().max(), Some(deepest));
                    // expanded sizes (weight 1 each) against counting every path by brute force
                    let mut g = graph(n, &edges);
                    (0..n).for_each(|v| g.weigh(v, 1));
                    let inlined = g.inlined(&h);
                    for v in 0..n {
                        let sizes = |v: usize| g.call_size(&inlined, v);
                        let (mut count, mut todo) = (0u64, vec![v]);
                        while let Some(x) = todo.pop() {
                            count += 1;
                            if count > 1 << 16 {
                                break;
                            }
                            todo.extend(edges.iter().filter(|e| e.0 == x).map(|e| e.1));
                        }
                        if count <= 1 << 16 {
                            prop_assert_eq!(sizes(v), count);
                        } else {
                            prop_assert!(sizes(v) > 1 << 16);
                        }
                    }
                }
            }
        }
    }
}
