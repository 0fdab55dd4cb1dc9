//! volumes, volumeIO, multiVolume and the volume's stats: data written in one pod read in the next, files of some MiB checksummed, several volumes in a pod, one volume in two pods (read-write and read-only), NodeGetVolumeStats against what was written.

use super::{CaseOutcome, Ctx, End};
use crate::container::{Bind, User};
use crate::data;
use crate::node::{Published, Want};
use crate::report::{CallNote, Failure};

const MIB: usize = 1 << 20;

/// Upstream's "should store data": a pod writes, is deleted (the volume unpublished and
/// Upstream's "should store data": a pod writes, is deleted (the volume unpublished and
/// unstaged), and a new pod on the node reads it — in containers when there are containers.
pub async fn store_data(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let content = format!("Hello from kvol test-driver, volume {}", volume.name);
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let injector = ctx.node.start_pod("injector", &want).await?;
    write_in_pod(ctx, &injector.volumes[0], "index.html", &content)?;
    ctx.node.stop_pod(&injector).await?;
    let client = ctx.node.start_pod("client", &want).await?;
    expect_in_pod(
        ctx,
        &client.volumes[0],
        "index.html",
        &content,
        "the data did not survive the volume's NodeUnstageVolume and NodeStageVolume: a new pod, after the first was deleted",
    )?;
    ctx.node.stop_pod(&client).await?;
    Ok(End::Passed)
}

/// Writes `text` to the volume's file `name`: by a container's shell when there are
/// containers, else on the host.
fn write_in_pod(ctx: &Ctx<'_>, published: &Published, name: &str, text: &str) -> Result<(), Failure> {
    let Some(runtime) = ctx.containers else { return data::write(&published.path, name, text.as_bytes()) };
    let bind = [Bind { host: &published.path, read_only: false }];
    runtime.run(&bind, &User::root(), &format!("echo -n '{text}' > /v0/{name} && sync"))?;
    Ok(())
}

/// Checks that the volume's file `name` holds `text`, read by a container when there are
/// containers, else on the host.
fn expect_in_pod(
    ctx: &Ctx<'_>,
    published: &Published,
    name: &str,
    text: &str,
    what: &str,
) -> Result<(), Failure> {
    let Some(runtime) = ctx.containers else {
        return data::expect(&published.path, name, text.as_bytes(), what);
    };
    let bind = [Bind { host: &published.path, read_only: false }];
    let found = runtime
        .run(&bind, &User::root(), &format!("cat /v0/{name}"))
        .map_err(|f| Failure::new(format!("{what}: the container cannot read /v0/{name}: {}", f.message)))?;
    if found != text {
        return Err(Failure::new(format!(
            "{what}: the container read {found:?} from /v0/{name}, expected {text:?}"
        )));
    }
    Ok(())
}

/// Upstream's "should allow exec of files on the volume": a script written to the volume runs
/// (a volume mounted `noexec` would refuse it). Host-side: run from the published path.
pub async fn exec(ctx: &mut Ctx<'_>) -> CaseOutcome {
    use std::os::unix::fs::PermissionsExt;
    let volume = ctx.node.provision(ctx.size, None).await?;
    let pod = ctx.node.start_pod("exec", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    let dir = &pod.volumes[0].path;
    data::write(dir, "script.sh", b"#!/bin/sh\necho kvol-exec-ok\n")?;
    let script = dir.join("script.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Failure::new(format!("cannot chmod {}: {e}", script.display())))?;
    if let Some(runtime) = ctx.containers {
        let bind = [Bind { host: dir, read_only: false }];
        let printed = runtime.run(&bind, &User::root(), "/v0/script.sh").map_err(|f| {
            Failure::new(format!(
                "a container cannot run /v0/script.sh from the volume (mounted noexec?): {}",
                f.message
            ))
        })?;
        if printed.trim() != "kvol-exec-ok" {
            return Err(Failure::new(format!("/v0/script.sh ran in the container but printed {printed:?}")));
        }
        ctx.node.stop_pod(&pod).await?;
        return Ok(End::Passed);
    }
    let output = std::process::Command::new(&script).output().map_err(|e| {
        Failure::new(format!(
            "cannot run {} from the volume: {e} (is the volume mounted noexec?)",
            script.display()
        ))
    })?;
    let printed = String::from_utf8_lossy(&output.stdout);
    if printed.trim() != "kvol-exec-ok" {
        return Err(Failure::new(format!("{} ran but printed {printed:?}", script.display())));
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// "should store data" of a raw block volume: bytes written through the pod's device are read
/// through the device of a pod started after the first was deleted (the volume unmapped,
/// unpublished, unstaged and set up again).
pub async fn block_store_data(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision_block(ctx.size).await?;
    let content = data::pattern("block", 64 << 10);
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let writer = ctx.node.start_pod("block-writer", &want).await?;
    write_device(&writer.volumes[0].path, &content)?;
    ctx.node.stop_pod(&writer).await?;
    let reader = ctx.node.start_pod("block-reader", &want).await?;
    let found = read_device(&reader.volumes[0].path, content.len())?;
    if found != content {
        return Err(Failure::new(format!(
            "the first {} bytes of the block device {} (sha256 {}) are not what the first pod wrote (sha256 {}): the data did not survive the volume's teardown and set-up",
            content.len(),
            reader.volumes[0].path.display(),
            data::sha256_hex(&found),
            data::sha256_hex(&content)
        )));
    }
    ctx.node.stop_pod(&reader).await?;
    Ok(End::Passed)
}

fn write_device(device: &std::path::Path, bytes: &[u8]) -> Result<(), Failure> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .map_err(|e| Failure::new(format!("cannot open the block device {}: {e}", device.display())))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Failure::new(format!("cannot write the block device {}: {e}", device.display())))
}

fn read_device(device: &std::path::Path, len: usize) -> Result<Vec<u8>, Failure> {
    use std::io::Read as _;
    let mut buffer = vec![0; len];
    std::fs::File::open(device)
        .and_then(|mut f| f.read_exact(&mut buffer))
        .map_err(|e| Failure::new(format!("cannot read the block device {}: {e}", device.display())))?;
    Ok(buffer)
}

/// fsGroupChangePolicy OnRootMismatch: a pod with fsGroup 1000 writes a file whose group is
/// then changed (as `chgrp` in the pod would); a new pod with the same fsGroup finds the
/// volume's root already right, so the file keeps the group it was given.
pub async fn fs_group_on_root_mismatch(ctx: &mut Ctx<'_>) -> CaseOutcome {
    use kvol_plugin::plugin::FsGroupChangePolicy::OnRootMismatch;
    use std::os::unix::fs::MetadataExt;
    let volume = ctx.node.provision(ctx.size, None).await?;
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let first = ctx.node.start_pod_with_fs_group("fsgroup-first", &want, 1000, OnRootMismatch).await?;
    let file = first.volumes[0].path.join("file");
    data::write(&first.volumes[0].path, "file", b"owned")?;
    nix::unistd::chown(&file, None, Some(nix::unistd::Gid::from_raw(3000)))
        .map_err(|e| Failure::new(format!("cannot chgrp {}: {e}", file.display())))?;
    ctx.node.stop_pod(&first).await?;
    let second = ctx.node.start_pod_with_fs_group("fsgroup-second", &want, 1000, OnRootMismatch).await?;
    let dir = &second.volumes[0].path;
    let gid = |path: &std::path::Path| {
        std::fs::metadata(path)
            .map(|m| m.gid())
            .map_err(|e| Failure::new(format!("cannot stat {}: {e}", path.display())))
    };
    let (root, file) = (gid(dir)?, gid(&dir.join("file"))?);
    if root != 1000 {
        return Err(Failure::new(format!(
            "the volume's root {} has group {root}, not the fsGroup 1000",
            dir.display()
        )));
    }
    if file != 3000 {
        return Err(Failure::new(format!(
            "the file whose group the first pod changed to 3000 has group {file}: the ownership walk ran although the root matched (OnRootMismatch)"
        )));
    }
    ctx.node.stop_pod(&second).await?;
    Ok(End::Passed)
}

/// fsGroupChangePolicy Always: a pod with fsGroup 1000 writes a file; a new pod with fsGroup
/// 2000 finds the volume's root and that file given group 2000 (kubelet's ownership walk,
/// here kvol's CSI plugin with the CSIDriver's `fsGroupPolicy: File`).
pub async fn fs_group_always(ctx: &mut Ctx<'_>) -> CaseOutcome {
    use kvol_plugin::plugin::FsGroupChangePolicy::Always;
    use std::os::unix::fs::MetadataExt;
    let volume = ctx.node.provision(ctx.size, None).await?;
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let first = ctx.node.start_pod_with_fs_group("fsgroup-1000", &want, 1000, Always).await?;
    data::write(&first.volumes[0].path, "file", b"owned")?;
    ctx.node.stop_pod(&first).await?;
    let second = ctx.node.start_pod_with_fs_group("fsgroup-2000", &want, 2000, Always).await?;
    let dir = &second.volumes[0].path;
    for path in [dir.clone(), dir.join("file")] {
        let gid = std::fs::metadata(&path)
            .map_err(|e| Failure::new(format!("cannot stat {}: {e}", path.display())))?
            .gid();
        if gid != 2000 {
            return Err(Failure::new(format!(
                "{} has group {gid}, not the new pod's fsGroup 2000 (fsGroupChangePolicy Always)",
                path.display()
            )));
        }
    }
    if let Some(runtime) = ctx.containers {
        // A non-root user whose only way in is the fsGroup writes, and its file gets the group.
        let user = User { uid: 1001, gid: 1001, groups: vec![2000] };
        let bind = [Bind { host: dir, read_only: false }];
        let group =
            runtime.run(&bind, &user, "touch /v0/by-user && stat -c %g /v0/by-user").map_err(|f| {
                Failure::new(format!(
                    "a container as uid 1001 with fsGroup 2000 cannot write the volume: {}",
                    f.message
                ))
            })?;
        if group.trim() != "2000" {
            return Err(Failure::new(format!(
                "a file the container made in the volume has group {}, not the fsGroup 2000 (no setgid on the volume root?)",
                group.trim()
            )));
        }
    }
    ctx.node.stop_pod(&second).await?;
    Ok(End::Passed)
}

/// Upstream's volumeIO: files of several sizes written, then read back in another pod with
/// their size and checksum.
pub async fn volume_io(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let largest = (ctx.size as usize / 4).clamp(MIB, 32 * MIB);
    let sizes = [MIB, largest];
    let writer =
        ctx.node.start_pod("io-writer", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    for (i, size) in sizes.iter().enumerate() {
        data::write(&writer.volumes[0].path, &format!("io-{i}"), &data::pattern(&format!("io-{i}"), *size))?;
    }
    ctx.node.stop_pod(&writer).await?;
    let reader =
        ctx.node.start_pod("io-reader", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    for (i, size) in sizes.iter().enumerate() {
        let what = format!("a {} MiB file read in a second pod", size / MIB);
        data::expect(
            &reader.volumes[0].path,
            &format!("io-{i}"),
            &data::pattern(&format!("io-{i}"), *size),
            &what,
        )?;
    }
    ctx.node.stop_pod(&reader).await?;
    Ok(End::Passed)
}

/// Two volumes in one pod, each with its own data, still there (and not swapped) in the pod
/// made again on the node.
pub async fn two_volumes(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let a = ctx.node.provision(ctx.size, None).await?;
    let b = ctx.node.provision(ctx.size, None).await?;
    let wanted = [
        Want::Persistent { volume: &a, read_only: false },
        Want::Persistent { volume: &b, read_only: false },
    ];
    let pod = ctx.node.start_pod("two-volumes", &wanted).await?;
    for (i, published) in pod.volumes.iter().enumerate() {
        data::write(&published.path, "data", &data::pattern(&format!("volume-{i}"), 4096))?;
    }
    ctx.node.stop_pod(&pod).await?;
    let again = ctx.node.start_pod("two-volumes-again", &wanted).await?;
    for (i, published) in again.volumes.iter().enumerate() {
        let what = format!(
            "volume {} of the pod made again on the node (unstaged and staged again in between)",
            published.spec.name()
        );
        data::expect(&published.path, "data", &data::pattern(&format!("volume-{i}"), 4096), &what)?;
    }
    ctx.node.stop_pod(&again).await?;
    Ok(End::Passed)
}

/// One volume in two pods on the node at once (staged once, published twice): each sees
/// what the other writes.
pub async fn same_volume_two_pods(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let first = ctx.node.start_pod("first", &want).await?;
    let second = ctx.node.start_pod("second", &want).await?;
    data::write(&first.volumes[0].path, "from-first", b"first")?;
    data::write(&second.volumes[0].path, "from-second", b"second")?;
    data::expect(
        &second.volumes[0].path,
        "from-first",
        b"first",
        "the second pod, reading what the first wrote",
    )?;
    data::expect(
        &first.volumes[0].path,
        "from-second",
        b"second",
        "the first pod, reading what the second wrote",
    )?;
    ctx.node.stop_pod(&second).await?;
    // The first pod keeps its volume while the second goes.
    data::expect(
        &first.volumes[0].path,
        "from-second",
        b"second",
        "the first pod, after the second pod was deleted",
    )?;
    ctx.node.stop_pod(&first).await?;
    Ok(End::Passed)
}

/// The volume in a read-write pod and in a read-only pod at once: the read-only pod reads
/// the data and cannot write (NodePublishVolume's `readonly` honoured); the other still can.
pub async fn read_only(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let writer =
        ctx.node.start_pod("writer", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    data::write(&writer.volumes[0].path, "data", b"shared")?;
    let reader =
        ctx.node.start_pod("read-only", &[Want::Persistent { volume: &volume, read_only: true }]).await?;
    let published = &reader.volumes[0];
    data::expect(&published.path, "data", b"shared", "the read-only pod")?;
    expect_read_only_publish(published, "the pod that has the volume read-only")?;
    data::write(&writer.volumes[0].path, "still-writable", b"yes")?;
    ctx.node.stop_pod(&reader).await?;
    ctx.node.stop_pod(&writer).await?;
    Ok(End::Passed)
}

/// Checks that a volume published read-only refuses writes; a write that gets through is the
/// driver ignoring NodePublishVolume's `readonly`.
pub fn expect_read_only_publish(published: &Published, what: &str) -> Result<(), Failure> {
    data::expect_read_only(&published.path, what).map_err(|f| {
        Failure::new(format!("{}: the driver ignored NodePublishVolume's readonly", f.message)).with_call(
            CallNote {
                rpc: "NodePublishVolume".to_string(),
                request: published.request.clone(),
                answer: "OK, and a writable mount".to_string(),
                kubelet:
                    "kubelet trusts the driver: the container could write to a volume its pod has read-only"
                        .to_string(),
            },
        )
    })
}

/// NodeGetVolumeStats after 8 MiB were written: the usage covers them, and capacity,
/// available and used agree with each other.
pub async fn stats(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let pod = ctx.node.start_pod("stats", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    let published = &pod.volumes[0];
    let written = (8 * MIB).min(ctx.size as usize / 2) as u64;
    data::write(&published.path, "filler", &data::pattern("stats", written as usize))?;
    let stats = ctx.node.stats(&pod, published).await?;
    let note = |answer: String| {
        CallNote {
        rpc: "NodeGetVolumeStats".to_string(),
        request: format!("volume_id={} volume_path={}", volume.handle, published.path.display()),
        answer,
        kubelet: "kubelet publishes these figures as kubelet_volume_stats_* and uses them for ephemeral-storage eviction".to_string(),
    }
    };
    let answer = format!("{stats:?}");
    let problem = stats_problem(&stats, written);
    if let Some(problem) = problem {
        return Err(Failure::new(format!("NodeGetVolumeStats lies: {problem}")).with_call(note(answer)));
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// What is wrong with stats taken after `written` bytes went into the volume. Pure.
pub fn stats_problem(stats: &kvol_plugin::plugin::VolumeStats, written: u64) -> Option<String> {
    let (Some(capacity), Some(used)) = (stats.capacity_bytes, stats.used_bytes) else {
        return Some("it reports no capacity or no used bytes".to_string());
    };
    // 90 %: a filesystem may keep some of a fresh file's blocks in its journal for a moment.
    if used < written / 10 * 9 {
        return Some(format!("used_bytes is {used} after {written} bytes were written and synced"));
    }
    if used > capacity {
        return Some(format!("used_bytes {used} is more than the capacity {capacity}"));
    }
    if let Some(available) = stats.available_bytes
        && available > capacity
    {
        return Some(format!("available_bytes {available} is more than the capacity {capacity}"));
    }
    if let (Some(inodes), Some(used_inodes)) = (stats.inodes, stats.inodes_used)
        && (used_inodes == 0 || used_inodes > inodes)
    {
        return Some(format!("{used_inodes} inodes used of {inodes}, with a file in the volume"));
    }
    None
}

#[cfg(test)]
mod tests {
    use kvol_plugin::plugin::VolumeStats;

    use super::stats_problem;

    #[test]
    fn stats_that_cannot_be_true_are_told() {
        let stats = |capacity, available, used, inodes, inodes_used| VolumeStats {
            capacity_bytes: capacity,
            available_bytes: available,
            used_bytes: used,
            inodes,
            inodes_used,
            ..VolumeStats::default()
        };
        const M: u64 = 1 << 20;
        // (stats, written, problem starts with)
        let table = [
            (stats(Some(100 * M), Some(90 * M), Some(10 * M), Some(100), Some(2)), 8 * M, None),
            (stats(Some(100 * M), None, Some(8 * M), None, None), 8 * M, None),
            (stats(Some(100 * M), Some(100 * M), Some(0), None, None), 8 * M, Some("used_bytes is 0")),
            (stats(None, None, Some(8 * M), None, None), 8 * M, Some("it reports no capacity")),
            (stats(Some(M), None, Some(8 * M), None, None), 8 * M, Some("used_bytes 8388608 is more than")),
            (stats(Some(100 * M), Some(200 * M), Some(8 * M), None, None), 8 * M, Some("available_bytes")),
            (stats(Some(100 * M), None, Some(8 * M), Some(10), Some(0)), 8 * M, Some("0 inodes used of 10")),
        ];
        for (s, written, problem) in table {
            let found = stats_problem(&s, written);
            match problem {
                None => assert_eq!(found, None, "{s:?}"),
                Some(start) => {
                    assert!(found.as_deref().is_some_and(|f| f.starts_with(start)), "{s:?}: {found:?}")
                }
            }
        }
    }
}
