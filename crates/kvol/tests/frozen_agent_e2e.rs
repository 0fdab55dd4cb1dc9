//! A frozen agent (SIGSTOP, longer than every deadline it keeps) on the real binary with real mounts: on thaw no deadline that passed while it was frozen turns into a teardown of a wanted volume, and what changed meanwhile is applied.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::Node;
use support::claim_pods::{gone, identities, pod, published, storage};

const DRIVER: &str = "hostpath.csi.kvol.io";

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_frozen_agent_applies_what_changed_on_thaw_and_tears_down_nothing_wanted() {
    support::enter_private_mount_namespace();
    let mut node = Node::new();
    // Short deadlines, so freezing outlasts each: driver calls, resync, republish.
    node.agent_args =
        ["--csi-call-timeout-seconds", "2", "--republish-seconds", "1"].map(String::from).to_vec();
    node.write("storage.yaml", &storage(DRIVER));
    node.write("kept.yaml", &pod("kept", DRIVER));
    node.write("leaving.yaml", &pod("leaving", DRIVER));
    node.start();
    let report = node
        .wait(LIMIT, |r| published(r, "kept") && published(r, "leaving"))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    let kept_before = identities(&report, "kept");
    let mounts: usize = kept_before.iter().map(|(_, _, ids)| ids.len()).sum();
    assert!(mounts >= 2, "the claim and the ephemeral volume are mounts: {kept_before:?}");
    let data = report.volumes.iter().find(|v| v.pod == "default/kept" && v.volume == "data").unwrap();
    let file = data.target.clone().unwrap().join("written-before");
    std::fs::write(&file, "kept through the freeze").unwrap();

    node.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    node.remove("leaving.yaml");
    node.write("arriving.yaml", &pod("arriving", DRIVER));
    std::thread::sleep(Duration::from_secs(8));
    node.signal(Signal::SIGCONT);

    let report = node
        .wait(LIMIT, |r| published(r, "arriving") && gone(r, "leaving") && published(r, "kept"))
        .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
    eprintln!("frozen for 8 s; settled {:?} after the freeze began", frozen.elapsed());
    assert_eq!(identities(&report, "kept"), kept_before, "the kept pod's volumes are the same mounts");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept through the freeze");
    let log = node.agent_log();
    let kept_uid = &report.volumes.iter().find(|v| v.pod == "default/kept").unwrap().pod_uid;
    let torn: Vec<&str> =
        log.lines().filter(|l| l.contains("volume_unmount") && l.contains(kept_uid.as_str())).collect();
    assert!(torn.is_empty(), "nothing of the kept pod was unpublished: {torn:?}");
    assert!(report.volumes.iter().all(|v| v.last_error.is_none()), "{:#?}", report.volumes);
    node.remove("kept.yaml");
    node.remove("arriving.yaml");
    node.wait(LIMIT, |r| r.volumes.is_empty()).unwrap_or_else(|e| panic!("{e}\n{}", node.agent_log()));
}
