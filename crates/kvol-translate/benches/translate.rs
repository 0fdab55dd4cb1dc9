//! Nanoseconds per translation for each operation over a realistic corpus, against a clone baseline.
//!
//! One criterion "iteration" is one translation: each timed batch walks the corpus round-robin,
//! so the reported time is the mean per object across every plugin and variant. The baseline is
//! a deep clone of the same objects (upstream's library deep-copies every input too). After
//! criterion's own report, a summary prints ns per translation, the ratio to the baseline, and
//! the comparison with upstream's Go library (~1.9 µs per PV) and kvol's target (< 0.4 µs).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::Criterion;
use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

// The kvol binary allocates with mimalloc too, so this is what `kvol` itself sees.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measured (total time, translations) per benchmark, for the closing summary.
static TOTALS: Mutex<BTreeMap<&'static str, (Duration, u64)>> = Mutex::new(BTreeMap::new());

fn record(name: &'static str, d: Duration, n: u64) {
    let mut t = TOTALS.lock().unwrap();
    let e = t.entry(name).or_default();
    e.0 += d;
    e.1 += n;
}

/// The in-tree source of each plugin, as a PV spec fragment and an inline volume fragment.
fn sources() -> Vec<(&'static str, Value)> {
    vec![
        (
            "awsElasticBlockStore",
            json!({"volumeID": "aws://us-east-1a/vol-0a1b2c3d4e5f67890", "fsType": "ext4"}),
        ),
        ("gcePersistentDisk", json!({"pdName": "data-pd", "fsType": "ext4", "partition": 1})),
        (
            "azureDisk",
            json!({"diskName": "d", "diskURI": "/subscriptions/1/resourceGroups/rg/providers/Microsoft.Compute/disks/d",
                   "kind": "Managed", "cachingMode": "ReadOnly", "fsType": "ext4"}),
        ),
        (
            "azureFile",
            json!({"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "web"}),
        ),
        ("cinder", json!({"volumeID": "6e8c5b8d-1c51-4b7e-9d6b-2f7a1f5a9c11", "fsType": "xfs"})),
        (
            "vsphereVolume",
            json!({"volumePath": "[vsanDatastore] kubevols/data.vmdk", "fsType": "ext4", "storagePolicyName": "gold"}),
        ),
        ("portworxVolume", json!({"volumeID": "pxvol-1234", "fsType": "ext4"})),
        (
            "rbd",
            json!({"monitors": ["10.0.0.10:6789", "10.0.0.11:6789"], "pool": "replicapool",
                   "image": "kubernetes-dynamic-pvc-4b0b7e36-7a6f-11ee-8c99-0242ac120002", "user": "admin",
                   "secretRef": {"name": "ceph-secret", "namespace": "default"}}),
        ),
    ]
}

/// Three variants per plugin: bare; with labels and annotations; with node-affinity topology.
fn pv_corpus() -> Vec<PersistentVolume> {
    let mut out = Vec::new();
    for (i, (field, source)) in sources().into_iter().enumerate() {
        let inline_pv = |variant: usize| {
            let mut v = json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("pv-{i}-{variant}")},
                "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "standard",
                         "claimRef": {"namespace": "web", "name": format!("data-{i}"), "uid": "3f1c"},
                         field: source.clone()}
            });
            if variant == 1 {
                v["metadata"]["labels"] = json!({"topology.kubernetes.io/zone": "us-east-1a",
                    "topology.kubernetes.io/region": "us-east-1", "app": "web"});
                v["metadata"]["annotations"] = json!({"pv.kubernetes.io/provisioned-by": "kubernetes.io/x",
                    "openstorage.io/auth-secret-name": "s", "openstorage.io/auth-secret-namespace": "ns"});
            }
            if variant == 2 {
                v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a", "us-east-1b"]}]}]}});
            }
            serde_json::from_value::<PersistentVolume>(v).unwrap()
        };
        out.extend((0..3).map(inline_pv));
    }
    out
}

fn inline_corpus() -> Vec<Volume> {
    sources()
        .into_iter()
        .map(|(field, mut source)| {
            if let Some(m) = source.as_object_mut() {
                m.remove("secretNamespace");
                m.remove("storagePolicyName");
                if field == "azureDisk" {
                    m.insert("kind".into(), json!("Managed"));
                }
            }
            serde_json::from_value(json!({"name": format!("vol-{field}"), field: source})).unwrap()
        })
        .collect()
}

fn sc_corpus() -> Vec<(String, StorageClass)> {
    let params: Vec<(&str, Value)> = vec![
        (
            "kubernetes.io/aws-ebs",
            json!({"type": "gp3", "FSType": "ext4", "iopsPerGB": "10", "zones": "us-east-1a,us-east-1b"}),
        ),
        (
            "kubernetes.io/gce-pd",
            json!({"type": "pd-balanced", "replication-type": "none", "zone": "us-central1-a"}),
        ),
        ("kubernetes.io/azure-disk", json!({"skuname": "Premium_LRS", "zones": "1,2"})),
        ("kubernetes.io/azure-file", json!({"skuName": "Standard_LRS"})),
        ("kubernetes.io/cinder", json!({"type": "fast", "availability": "nova", "fstype": "ext4"})),
        (
            "kubernetes.io/vsphere-volume",
            json!({"storagePolicyName": "gold", "datastore": "vsan", "diskformat": "thin"}),
        ),
        (
            "kubernetes.io/portworx-volume",
            json!({"repl": "2", "openstorage.io/auth-secret-name": "s", "openstorage.io/auth-secret-namespace": "n"}),
        ),
        (
            "kubernetes.io/rbd",
            json!({"monitors": "10.0.0.10:6789", "adminId": "admin", "adminSecretName": "s", "pool": "rbd"}),
        ),
    ];
    params
        .into_iter()
        .map(|(prov, p)| {
            let sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "sc", "labels": {"app": "web"}}, "provisioner": prov, "parameters": p,
                "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"});
            (prov.to_string(), serde_json::from_value(sc).unwrap())
        })
        .collect()
}

/// Benchmarks `op` over `corpus`, one translation per iteration, round-robin.
fn bench<T>(c: &mut Criterion, name: &'static str, corpus: &[T], op: impl Fn(&T)) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut i = 0;
            for _ in 0..iters {
                op(black_box(&corpus[i]));
                i += 1;
                if i == corpus.len() {
                    i = 0;
                }
            }
            let d = start.elapsed();
            record(name, d, iters);
            d
        })
    });
}

/// Benchmarks an operation that consumes its input: copies are made before the clock starts,
/// in small batches that stay in cache, so the time is the translation alone (what a caller
/// that owns its objects pays).
fn bench_owned<T: Clone>(c: &mut Criterion, name: &'static str, corpus: &[T], op: impl Fn(T)) {
    const BATCH: u64 = 64;
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0u64;
            let mut next = 0usize;
            while done < iters {
                let n = BATCH.min(iters - done);
                let inputs: Vec<T> = (0..n)
                    .map(|_| {
                        next = (next + 1) % corpus.len();
                        corpus[next].clone()
                    })
                    .collect();
                let start = Instant::now();
                for input in inputs {
                    op(black_box(input));
                }
                total += start.elapsed();
                done += n;
            }
            record(name, total, iters);
            total
        })
    });
}

fn main() {
    let pvs = pv_corpus();
    let inline = inline_corpus();
    let scs = sc_corpus();
    // Every corpus item must translate: a benchmark of errors would measure nothing.
    let csi_pvs: Vec<PersistentVolume> = pvs
        .iter()
        .map(|pv| {
            kvol_translate::translate_in_tree_pv_to_csi(pv)
                .unwrap_or_else(|e| panic!("corpus PV {:?}: {e}", pv.metadata.name))
        })
        .collect();
    for v in &inline {
        kvol_translate::translate_in_tree_inline_volume_to_csi(v, "web")
            .unwrap_or_else(|e| panic!("{}: {e}", v.name));
    }
    for (p, sc) in &scs {
        kvol_translate::translate_in_tree_storage_class_to_csi(p, sc).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    for pv in &csi_pvs {
        kvol_translate::translate_csi_pv_to_in_tree(pv)
            .unwrap_or_else(|e| panic!("{:?}: {e}", pv.metadata.name));
    }

    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, "baseline/clone_pv", &pvs, |pv| {
        black_box(pv.clone());
    });
    bench(&mut c, "pv_in_tree_to_csi", &pvs, |pv| {
        black_box(kvol_translate::translate_in_tree_pv_to_csi(pv).unwrap());
    });
    bench_owned(&mut c, "pv_in_tree_to_csi_owned", &pvs, |pv| {
        black_box(kvol_translate::translate_in_tree_pv_to_csi_owned(pv).unwrap());
    });
    bench(&mut c, "inline_to_csi", &inline, |v| {
        black_box(kvol_translate::translate_in_tree_inline_volume_to_csi(v, "web").unwrap());
    });
    bench(&mut c, "storage_class_to_csi", &scs, |(p, sc)| {
        black_box(kvol_translate::translate_in_tree_storage_class_to_csi(p, sc).unwrap());
    });
    bench(&mut c, "pv_csi_to_in_tree", &csi_pvs, |pv| {
        black_box(kvol_translate::translate_csi_pv_to_in_tree(pv).unwrap());
    });
    bench_owned(&mut c, "pv_csi_to_in_tree_owned", &csi_pvs, |pv| {
        black_box(kvol_translate::translate_csi_pv_to_in_tree_owned(pv).unwrap());
    });
    bench(&mut c, "is_pv_migratable", &pvs, |pv| {
        black_box(kvol_translate::is_pv_migratable(pv));
    });
    c.final_summary();

    let totals = TOTALS.lock().unwrap();
    let ns = |name: &str| totals.get(name).map(|(d, n)| d.as_nanos() as f64 / (*n).max(1) as f64);
    let Some(baseline) = ns("baseline/clone_pv") else { return };
    println!(
        "\nsummary (mean over every measured iteration; {} PVs, {} inline volumes, {} classes)",
        pvs.len(),
        inline.len(),
        scs.len()
    );
    println!("{:<24} {:>10} {:>14}", "operation", "ns/object", "x clone(PV)");
    for (name, _) in totals.iter() {
        let v = ns(name).unwrap();
        println!("{name:<24} {v:>10.1} {:>14.2}", v / baseline);
    }
    println!("\nper plugin, pv_in_tree_to_csi (3 variants each; simple timed loop, not criterion)");
    for chunk in pvs.chunks(3) {
        let field = kvol_translate::pv_sources(&chunk[0])[0].0;
        let rounds = 20_000u32;
        let start = Instant::now();
        for _ in 0..rounds {
            for pv in chunk {
                black_box(kvol_translate::translate_in_tree_pv_to_csi(black_box(pv)).unwrap());
            }
        }
        let per = start.elapsed().as_nanos() as f64 / f64::from(rounds * chunk.len() as u32);
        let start = Instant::now();
        for _ in 0..rounds {
            for pv in chunk {
                black_box(black_box(pv).clone());
            }
        }
        let clone = start.elapsed().as_nanos() as f64 / f64::from(rounds * chunk.len() as u32);
        println!(
            "  {field:<22} {per:>8.1} ns   (clone {clone:>6.1} ns, translation work {:>6.1} ns)",
            per - clone
        );
    }
    if let Some(pv) = ns("pv_in_tree_to_csi") {
        println!(
            "pv_in_tree_to_csi (borrowed, includes the deep copy upstream also makes): {pv:.0} ns per PV; \
             upstream Go ~1900 ns (x{:.1} faster); kvol target < 400 ns: {}",
            1900.0 / pv,
            if pv < 400.0 { "met" } else { "NOT met" }
        );
    }
    if let Some(pv) = ns("pv_in_tree_to_csi_owned") {
        println!(
            "pv_in_tree_to_csi_owned (no copy; the caller owns the PV): {pv:.0} ns per PV; target < 400 ns: {}",
            if pv < 400.0 { "met" } else { "NOT met" }
        );
    }
}
