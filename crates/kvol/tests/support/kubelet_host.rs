//! What running the real kubelet beside the tests takes on the host: the sysctls it changes put back, and scratch directories bound over the host paths it writes whatever `--root-dir` says.
// Compiled into every test binary that has `support`; only the kubelet's users call it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// The sysctls a starting kubelet sets (the first three) or may set (the keys), under /proc/sys.
pub const SYSCTLS: [&str; 5] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The sysctls as they were before the kubelet started; put back when dropped (after it
/// stopped, also on a panic).
#[derive(Debug)]
pub struct Sysctls(Vec<(PathBuf, String)>);

impl Sysctls {
    /// Reads those of [`SYSCTLS`] that the kernel has.
    pub fn save() -> Sysctls {
        let read =
            |path: PathBuf| Some((path.clone(), std::fs::read_to_string(&path).ok()?.trim().to_string()));
        Sysctls(SYSCTLS.iter().filter_map(|name| read(Path::new("/proc/sys").join(name))).collect())
    }

    /// Puts back every value that changed; what changed (`name: now -> before`).
    pub fn restore(&self) -> Vec<String> {
        let mut changed = Vec::new();
        for (path, before) in &self.0 {
            let now = std::fs::read_to_string(path).unwrap_or_default().trim().to_string();
            if now != *before {
                let name =
                    path.strip_prefix("/proc/sys").unwrap_or(path).display().to_string().replace('/', ".");
                match std::fs::write(path, before) {
                    Ok(()) => changed.push(format!("{name}: {now} -> {before}")),
                    Err(e) => eprintln!("cannot put back sysctl {name} ({now} -> {before}): {e}"),
                }
            }
        }
        changed
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for change in self.restore() {
            eprintln!("sysctl put back: {change}");
        }
    }
}

/// Scratch directories bound over `/var/log` and `/var/lib/kubelet` in this thread's mount
/// namespace; unbound when dropped, and `/var/lib/kubelet` removed if it was made for them.
#[derive(Debug)]
pub struct HostDirs {
    made_var_lib_kubelet: bool,
    bound: Vec<PathBuf>,
}

impl HostDirs {
    /// Binds `<scratch>/var-log` and `<scratch>/var-lib-kubelet` over the host's.
    pub fn bind(scratch: &Path) -> HostDirs {
        let var_lib_kubelet = Path::new("/var/lib/kubelet");
        let mut dirs = HostDirs { made_var_lib_kubelet: false, bound: Vec::new() };
        if !var_lib_kubelet.exists() {
            std::fs::create_dir(var_lib_kubelet).expect("make the mount point /var/lib/kubelet");
            dirs.made_var_lib_kubelet = true;
        }
        for (source, target) in [("var-log", "/var/log"), ("var-lib-kubelet", "/var/lib/kubelet")] {
            let source = scratch.join(source);
            std::fs::create_dir_all(&source).expect("a scratch directory");
            nix::mount::mount(Some(&source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .unwrap_or_else(|e| panic!("bind {} over {target}: {e}", source.display()));
            dirs.bound.push(PathBuf::from(target));
        }
        dirs
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for target in self.bound.iter().rev() {
            if let Err(e) = nix::mount::umount2(target, MntFlags::MNT_DETACH) {
                eprintln!("cannot unmount {}: {e}", target.display());
            }
        }
        if self.made_var_lib_kubelet
            && let Err(e) = std::fs::remove_dir("/var/lib/kubelet")
        {
            eprintln!("cannot remove /var/lib/kubelet, which was made as a mount point: {e}");
        }
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}
