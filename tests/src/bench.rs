//! What the lab's benchmarks share.

/// Whether the benchmark `name` is selected by the filter arguments the
/// lab runner passes (`make bench FILTER=...`): no filter selects every
/// benchmark, else one that is part of `name` (flags are ignored).
pub fn selected(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}
