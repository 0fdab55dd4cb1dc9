//! Registry lookups timed against a `HashMap` baseline, plus a lookups-only mode for counting syscalls.
//!
//! `cargo bench -p kvol-plugin --bench registry` prints ns per lookup (median of several rounds
//! of a million lookups) for a registry of the in-tree descriptors, three compiled-in fakes and
//! 1,000 dynamic plugins. `registry --lookups-only N` builds the same registry, does N lookups
//! and prints only how many succeeded (see `lookup-syscalls.sh`).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use kvol_api::MigratablePlugin;
use kvol_plugin::intree::InTreeDescriptor;
use kvol_plugin::testing::{FakePlugin, Part, csi_pv, flex_pv, in_tree_pv};
use kvol_plugin::{DynamicSource, PluginRef, PluginRegistry, ProbeEvent, VolumeSpec};

/// Dynamic plugins per source (Flexvolume and CSI).
const PER_SOURCE: usize = 500;
const LOOKUPS_PER_ROUND: usize = 1_000_000;
const ROUNDS: usize = 7;
const TARGET_NS: f64 = 1_000.0;
/// Inputs cycled through per operation; a power of two, so picking one is a mask.
const INPUTS: usize = 1024;

fn flex_driver(i: usize) -> String {
    format!("vendor{i}/driver")
}

fn csi_driver(i: usize) -> String {
    format!("csi{i}.example.com")
}

/// The registry under test: in-tree descriptors, compiled-in fakes, 500 Flexvolume and 500 CSI drivers.
fn build_registry() -> PluginRegistry {
    let mut compiled: Vec<PluginRef> =
        MigratablePlugin::ALL.into_iter().map(|p| Arc::new(InTreeDescriptor::new(p)) as PluginRef).collect();
    compiled.extend([
        FakePlugin::field("kubernetes.io/empty-dir", "emptyDir").build_ref(),
        FakePlugin::field("kubernetes.io/host-path", "hostPath").persistent(true).build_ref(),
        FakePlugin::field("kubernetes.io/local-volume", "local").persistent(true).build_ref(),
    ]);
    let registry = PluginRegistry::new(compiled).expect("compiled-in names are unique");
    let flex = (0..PER_SOURCE).map(|i| {
        ProbeEvent::AddOrUpdate(
            FakePlugin::flex(&flex_driver(i)).offers([Part::Attach, Part::Stage]).build_ref(),
        )
    });
    assert!(registry.apply(DynamicSource::Flexvolume, flex).is_empty());
    let csi = (0..PER_SOURCE).map(|i| {
        ProbeEvent::AddOrUpdate(
            FakePlugin::csi(&csi_driver(i)).offers([Part::Attach, Part::Stage]).build_ref(),
        )
    });
    assert!(registry.apply(DynamicSource::Csi, csi).is_empty());
    registry
}

/// What the lookups look up, [`INPUTS`] of each, built before any timing.
struct Inputs {
    names: Vec<String>,
    csi: Vec<VolumeSpec>,
    flex: Vec<VolumeSpec>,
    in_tree: Vec<VolumeSpec>,
}

impl Inputs {
    fn new(registry: &PluginRegistry) -> Inputs {
        let snap = registry.snapshot();
        let all: Vec<String> = snap.plugins().iter().map(|r| r.plugin.name().to_string()).collect();
        Inputs {
            names: (0..INPUTS).map(|i| all[i % all.len()].clone()).collect(),
            csi: (0..INPUTS).map(|i| csi_pv(&format!("pv-{i}"), &csi_driver(i % PER_SOURCE))).collect(),
            flex: (0..INPUTS).map(|i| flex_pv(&format!("pv-{i}"), &flex_driver(i % PER_SOURCE))).collect(),
            in_tree: (0..INPUTS)
                .map(|i| {
                    in_tree_pv(&format!("pv-{i}"), MigratablePlugin::ALL[i % MigratablePlugin::ALL.len()])
                })
                .collect(),
        }
    }
}

/// Median ns per call of `lookup(i)` over [`ROUNDS`] rounds of [`LOOKUPS_PER_ROUND`] calls;
/// every call must succeed.
fn measure(mut lookup: impl FnMut(usize) -> bool) -> f64 {
    let mut per_round: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            let mut ok = 0usize;
            for i in 0..LOOKUPS_PER_ROUND {
                ok += usize::from(lookup(black_box(i) & (INPUTS - 1)));
            }
            let ns = start.elapsed().as_nanos() as f64 / LOOKUPS_PER_ROUND as f64;
            assert_eq!(ok, LOOKUPS_PER_ROUND, "every lookup must succeed");
            ns
        })
        .collect();
    per_round.sort_by(f64::total_cmp);
    per_round[ROUNDS / 2]
}

/// One of the registry lookups, by index.
fn lookup(registry: &PluginRegistry, inputs: &Inputs, op: usize, i: usize) -> bool {
    let snap = registry.snapshot();
    match op {
        0 => snap.find_by_name(&inputs.names[i]).is_ok(),
        1 => snap.find_by_spec(&inputs.csi[i]).is_ok(),
        2 => snap.find_by_spec(&inputs.flex[i]).is_ok(),
        3 => snap.find_by_spec(&inputs.in_tree[i]).is_ok(),
        4 => snap.find_attachable_by_spec(&inputs.csi[i]).is_ok_and(|p| p.is_some()),
        _ => snap.find_by_spec(&inputs.csi[i]).is_ok(),
    }
}

/// `--lookups-only N`: N lookups round-robin over every timed operation, snapshot load included.
fn lookups_only(n: u64) {
    let registry = build_registry();
    let inputs = Inputs::new(&registry);
    let mut ok = 0u64;
    for k in 0..n {
        let k = black_box(k) as usize;
        ok += u64::from(lookup(&registry, &inputs, k % 6, k & (INPUTS - 1)));
    }
    println!("{ok}");
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    if let Some(arg) = args.next()
        && arg == "--lookups-only"
    {
        let n = args.next().and_then(|n| n.parse().ok()).expect("usage: registry --lookups-only N");
        lookups_only(n);
        return;
    }

    let started = Instant::now();
    let registry = build_registry();
    let built = started.elapsed();
    let inputs = Inputs::new(&registry);
    let snap = registry.snapshot();
    let plugins = snap.plugins().len();

    let keys: Vec<String> = (0..PER_SOURCE).flat_map(|i| [csi_driver(i), flex_driver(i)]).collect();
    let map: HashMap<String, usize> = keys.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect();
    let probes: Vec<&str> = (0..INPUTS).map(|i| keys[i % keys.len()].as_str()).collect();

    let baseline = measure(|i| black_box(map.get(probes[i])).is_some());
    let rows: Vec<(&str, f64)> = vec![
        ("find_by_name", measure(|i| snap.find_by_name(&inputs.names[i]).is_ok())),
        ("find_by_spec (CSI PV)", measure(|i| snap.find_by_spec(&inputs.csi[i]).is_ok())),
        ("find_by_spec (Flexvolume PV)", measure(|i| snap.find_by_spec(&inputs.flex[i]).is_ok())),
        ("find_by_spec (in-tree PV)", measure(|i| snap.find_by_spec(&inputs.in_tree[i]).is_ok())),
        (
            "find_attachable_by_spec (CSI PV)",
            measure(|i| snap.find_attachable_by_spec(&inputs.csi[i]).is_ok_and(|p| p.is_some())),
        ),
        (
            "snapshot() + find_by_spec (CSI PV)",
            measure(|i| registry.snapshot().find_by_spec(&inputs.csi[i]).is_ok()),
        ),
    ];

    println!(
        "registry: {plugins} plugins ({} in-tree, 3 compiled-in, {PER_SOURCE} Flexvolume, {PER_SOURCE} CSI), built in {:.1} ms",
        MigratablePlugin::ALL.len(),
        built.as_secs_f64() * 1e3
    );
    println!("median of {ROUNDS} rounds x {LOOKUPS_PER_ROUND} lookups each, cycling {INPUTS} inputs\n");
    println!("{:<40} {:>10} {:>12} {:>9}", "operation", "ns/lookup", "x baseline", "< 1 us");
    println!(
        "{:<40} {:>10.1} {:>12.2} {:>9}",
        "HashMap<String, usize>::get (baseline)", baseline, 1.0, "yes"
    );
    for (name, ns) in rows {
        let under = if ns < TARGET_NS { "yes" } else { "NO" };
        println!("{name:<40} {ns:>10.1} {:>12.2} {under:>9}", ns / baseline);
    }
}
