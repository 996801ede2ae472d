//! The longest path through a graph of definitions that refer to each other, as a bound on how deep a
//! depth-first compiler (llguidance's Lark and JSON-schema compilers) can recurse from any start.
//!
//! A recursive compiler that memoizes what it finished (as llguidance does for rules, tokens and
//! `$ref`s) has on its stack a simple path of the reference graph. A simple path visits each member of
//! a strongly connected component at most once, so the longest path in the graph of components, each
//! weighing the sum of its members' weights, bounds every such stack whatever order the compiler walks
//! in. Everything here is iterative: the graph is request-supplied and may be thousands deep.

/// Definitions (nodes) with a weight each (the recursion levels one costs) and their references.
#[derive(Default)]
pub(super) struct DepthGraph {
    weight: Vec<usize>,
    edges: Vec<Vec<usize>>,
}

impl DepthGraph {
    /// Adds a node of `weight`; returns its index.
    pub(super) fn node(&mut self, weight: usize) -> usize {
        self.weight.push(weight);
        self.edges.push(Vec::new());
        self.weight.len() - 1
    }

    /// How many nodes.
    pub(super) fn len(&self) -> usize {
        self.weight.len()
    }

    /// Raises a node's weight to at least `weight`.
    pub(super) fn raise(&mut self, node: usize, weight: usize) {
        self.weight[node] = self.weight[node].max(weight);
    }

    /// A reference from `from` to `to`.
    pub(super) fn edge(&mut self, from: usize, to: usize) {
        self.edges[from].push(to);
    }

    /// The weight of the heaviest path from any node (0 for an empty graph).
    pub(super) fn longest_path_bound(&self) -> usize {
        let (comp, count) = components(&self.edges);
        let mut weight = vec![0usize; count];
        for (node, &c) in comp.iter().enumerate() {
            weight[c] = weight[c].saturating_add(self.weight[node]);
        }
        // Tarjan numbers a component after every component it reaches, so successors come first.
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (node, &c) in comp.iter().enumerate() {
            members[c].push(node);
        }
        let mut cost = vec![0usize; count];
        for c in 0..count {
            let mut tail = 0usize;
            for &node in &members[c] {
                for &to in &self.edges[node] {
                    if comp[to] != c {
                        tail = tail.max(cost[comp[to]]);
                    }
                }
            }
            cost[c] = weight[c].saturating_add(tail);
        }
        cost.into_iter().max().unwrap_or(0)
    }
}

/// Tarjan's strongly connected components, iteratively: each node's component, and how many.
fn components(edges: &[Vec<usize>]) -> (Vec<usize>, usize) {
    const NONE: usize = usize::MAX;
    let n = edges.len();
    let (mut index, mut low) = (vec![NONE; n], vec![0usize; n]);
    let mut on_stack = vec![false; n];
    let mut comp = vec![NONE; n];
    let (mut stack, mut calls) = (Vec::new(), Vec::<(usize, usize)>::new());
    let (mut next, mut count) = (0usize, 0usize);
    for root in 0..n {
        if index[root] != NONE {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        calls.push((root, 0));
        while let Some(&(v, i)) = calls.last() {
            if let Some(&w) = edges[v].get(i) {
                calls.last_mut().expect("a frame").1 += 1;
                if index[w] == NONE {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp[w] = count;
                    if w == v {
                        break;
                    }
                }
                count += 1;
            }
        }
    }
    (comp, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(weights: &[usize], edges: &[(usize, usize)]) -> usize {
        let mut g = DepthGraph::default();
        for &w in weights {
            g.node(w);
        }
        for &(a, b) in edges {
            g.edge(a, b);
        }
        g.longest_path_bound()
    }

    #[test]
    fn bounds_are_longest_paths_with_cycles_counted_whole() {
        type Case<'a> = (&'a [usize], &'a [(usize, usize)], usize);
        let cases: &[Case] = &[
            (&[], &[], 0),
            (&[3], &[], 3),
            (&[1, 1, 1], &[(0, 1), (1, 2)], 3),
            // Diamond: the heavier branch.
            (&[1, 5, 1, 1], &[(0, 1), (0, 2), (1, 3), (2, 3)], 7),
            // A cycle weighs all its members, then what it reaches.
            (&[1, 1, 1, 4], &[(0, 1), (1, 0), (1, 2), (2, 0), (2, 3)], 7),
            // Self reference.
            (&[2], &[(0, 0)], 2),
        ];
        for (w, e, want) in cases {
            assert_eq!(graph(w, e), *want, "weights {w:?} edges {e:?}");
        }
    }

    #[test]
    fn a_long_chain_is_measured_without_recursion() {
        let n = 200_000;
        let mut g = DepthGraph::default();
        for _ in 0..n {
            g.node(1);
        }
        for i in 0..n - 1 {
            g.edge(i, i + 1);
        }
        g.edge(n - 1, n / 2);
        assert_eq!(g.longest_path_bound(), n);
    }
}
