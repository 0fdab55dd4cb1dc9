//! The hostPath plugin: checks a node path against its declared type and binds it into the pod.
//!
//! Upstream's kubelet only checks the type and lets the container runtime bind the path into
//! containers. kvol has no runtime, so publishing bind-mounts the path onto the pod volume
//! directory (read-only when asked), and unpublishing unmounts it and removes the empty
//! target. The host path itself is never deleted.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::HostPathVolumeSource;

use super::{FileKind, bind_to_target, file_kind, has_backsteps, unmount_and_remove_target};
use crate::error::{PluginError, Result};
use crate::host::PluginHost;
use crate::plugin::{AccessMode, PluginKind, PublishRequest, UnpublishRequest, VolumeMounter, VolumePlugin};
use crate::spec::{SourceKey, VolumeSpec};

/// The plugin's upstream name.
pub const PLUGIN_NAME: &str = "kubernetes.io/host-path";

/// A hostPath volume's `type`, as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl HostPathType {
    /// The type an API string names; `None` for a string that names none.
    pub fn parse(text: &str) -> Option<HostPathType> {
        Some(match text {
            "" => HostPathType::Unset,
            "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
            "Directory" => HostPathType::Directory,
            "FileOrCreate" => HostPathType::FileOrCreate,
            "File" => HostPathType::File,
            "Socket" => HostPathType::Socket,
            "CharDevice" => HostPathType::CharDevice,
            "BlockDevice" => HostPathType::BlockDevice,
            _ => return None,
        })
    }

    /// The API spelling, with `unset` for the empty type.
    pub const fn name(self) -> &'static str {
        match self {
            HostPathType::Unset => "unset",
            HostPathType::DirectoryOrCreate => "DirectoryOrCreate",
            HostPathType::Directory => "Directory",
            HostPathType::FileOrCreate => "FileOrCreate",
            HostPathType::File => "File",
            HostPathType::Socket => "Socket",
            HostPathType::CharDevice => "CharDevice",
            HostPathType::BlockDevice => "BlockDevice",
        }
    }

    /// The kind a path of this type must be, with upstream's description of it.
    const fn expected(self) -> Option<(FileKind, &'static str)> {
        match self {
            HostPathType::Unset => None,
            HostPathType::DirectoryOrCreate | HostPathType::Directory => {
                Some((FileKind::Directory, "directory"))
            }
            HostPathType::FileOrCreate | HostPathType::File => Some((FileKind::File, "file")),
            HostPathType::Socket => Some((FileKind::Socket, "socket file")),
            HostPathType::CharDevice => Some((FileKind::CharDevice, "character device")),
            HostPathType::BlockDevice => Some((FileKind::BlockDevice, "block device")),
        }
    }
}

/// What the type check decides about a host path, given what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeDecision {
    /// Use the path as it is (it is of this kind).
    Use(FileKind),
    /// Create the directory (and its parents), mode 0755.
    CreateDirectory,
    /// Create an empty file, mode 0644; its directory must exist.
    CreateFile,
    /// Nothing is there and the type does not create it.
    Missing,
    /// Something of the wrong kind is there.
    Mismatch { expected: &'static str, found: FileKind },
}

/// Upstream's `checkType`: the decision for a host path of `path_type` where `found` is there.
pub fn decide(path_type: HostPathType, found: Option<FileKind>) -> TypeDecision {
    let Some(found) = found else {
        return match path_type {
            HostPathType::DirectoryOrCreate => TypeDecision::CreateDirectory,
            HostPathType::FileOrCreate => TypeDecision::CreateFile,
            // Upstream leaves an unset type to the runtime; kvol binds the path itself, so the
            // path must be there.
            _ => TypeDecision::Missing,
        };
    };
    match path_type.expected() {
        None => TypeDecision::Use(found),
        Some((kind, _)) if kind == found => TypeDecision::Use(found),
        Some((_, expected)) => TypeDecision::Mismatch { expected, found },
    }
}

/// Runs the type check on the node: stats the path and creates it when the type says so.
/// Returns what the path is afterwards.
pub fn prepare_host_path(path: &Path, path_type: HostPathType) -> Result<FileKind> {
    let found = file_kind(path).map_err(|e| PluginError::io("inspect", path, e))?;
    match decide(path_type, found) {
        TypeDecision::Use(kind) => Ok(kind),
        // The host path is outside the kubelet root and is the manifest's own (validated,
        // within --allowed-host-paths): it is created as given, as upstream does.
        TypeDecision::CreateDirectory => {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o755)
                .create(path)
                .map(|()| FileKind::Directory)
                .map_err(|e| PluginError::io("create directory", path, e))
        }
        TypeDecision::CreateFile => {
            // Like upstream, the file's directory is not created.
            let created =
                fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o644).open(path);
            created.map(|_| FileKind::File).map_err(|e| PluginError::io("create file", path, e))
        }
        TypeDecision::Missing => {
            Err(PluginError::HostPathMissing { path: path.to_path_buf(), kind: path_type.name() })
        }
        TypeDecision::Mismatch { expected, found } => {
            Err(PluginError::HostPathType { path: path.to_path_buf(), expected, found: found.type_name() })
        }
    }
}

/// The hostPath plugin (`kubernetes.io/host-path`).
#[derive(Debug)]
pub struct HostPathPlugin {
    host: PluginHost,
}

impl HostPathPlugin {
    pub fn new(host: PluginHost) -> HostPathPlugin {
        HostPathPlugin { host }
    }
}

/// The hostPath source of a spec, inline or persistent.
fn source_of(spec: &VolumeSpec) -> Option<&HostPathVolumeSource> {
    match spec.pv() {
        Some(pv) => pv.spec.as_ref()?.host_path.as_ref(),
        None => spec.inline_volume()?.host_path.as_ref(),
    }
}

/// The spec's host path and type, checked for what upstream validation refuses.
fn checked_source(spec: &VolumeSpec) -> Result<(&Path, HostPathType)> {
    let source = source_of(spec).ok_or_else(|| PluginError::invalid(spec, "it is not a hostPath volume"))?;
    let type_text = source.type_.as_deref().unwrap_or_default();
    let path_type = HostPathType::parse(type_text)
        .ok_or_else(|| PluginError::invalid(spec, format!("{type_text} is an invalid volume type")))?;
    let path = Path::new(&source.path);
    if !path.is_absolute() {
        return Err(PluginError::invalid(
            spec,
            format!("invalid HostPath `{}`: must be an absolute path", source.path),
        ));
    }
    if has_backsteps(path) {
        return Err(PluginError::invalid(
            spec,
            format!("invalid HostPath `{}`: must not contain '..'", source.path),
        ));
    }
    Ok((path, path_type))
}

/// Whether `path` lies at or under one of `allowed`, component by component (`/srv` allows
/// `/srv/a`, not `/srv2`); the reason naming the path and the prefixes if not. Pure.
pub fn check_allowed(path: &Path, allowed: &[PathBuf]) -> std::result::Result<(), String> {
    if allowed.iter().any(|prefix| path.starts_with(prefix)) {
        return Ok(());
    }
    let prefixes: Vec<String> = allowed.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "host path {} is outside the allowed host paths ({}) set by --allowed-host-paths",
        path.display(),
        prefixes.join(", ")
    ))
}

impl VolumePlugin for HostPathPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn kind(&self) -> PluginKind {
        PluginKind::CompiledIn
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Field("hostPath")]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        source_of(spec).is_some()
    }

    fn access_modes(&self) -> Vec<AccessMode> {
        vec![AccessMode::ReadWriteOnce]
    }

    fn is_persistent(&self) -> bool {
        true
    }

    /// The host path, as upstream names hostPath volumes.
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String> {
        let source =
            source_of(spec).ok_or_else(|| PluginError::invalid(spec, "it is not a hostPath volume"))?;
        Ok(source.path.clone())
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }
}

#[async_trait]
impl VolumeMounter for HostPathPlugin {
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        let (path, path_type) = checked_source(req.spec)?;
        if let Some(allowed) = &self.host.allowed_host_paths {
            check_allowed(path, allowed).map_err(|reason| PluginError::invalid(req.spec, reason))?;
        }
        let kind = prepare_host_path(path, path_type)?;
        let read_only = req.read_only || req.spec.read_only;
        let root = self.host.paths.open_root()?;
        bind_to_target(
            self.host.mounter.as_ref(),
            &root,
            path,
            req.target,
            kind == FileKind::Directory,
            read_only,
        )
    }

    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()> {
        let root = self.host.paths.open_root()?;
        unmount_and_remove_target(self.host.mounter.as_ref(), &root, req.target)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec, Volume};

    use super::*;

    #[test]
    fn allowed_host_paths_match_whole_components() {
        let allowed = [PathBuf::from("/srv"), PathBuf::from("/var/data/")];
        let cases: &[(&str, bool)] = &[
            ("/srv", true),
            ("/srv/a/b", true),
            ("/var/data", true),
            ("/var/data/x", true),
            ("/srv2", false),
            ("/sr", false),
            ("/var/database", false),
            ("/", false),
            ("/etc/shadow", false),
        ];
        for (path, ok) in cases {
            let got = check_allowed(Path::new(path), &allowed);
            assert_eq!(got.is_ok(), *ok, "{path}: {got:?}");
            if let Err(reason) = got {
                assert_eq!(
                    reason,
                    format!(
                        "host path {path} is outside the allowed host paths (/srv, /var/data/) set by --allowed-host-paths"
                    )
                );
            }
        }
        assert!(check_allowed(Path::new("/srv"), &[]).is_err(), "an empty list allows nothing");
    }
    use crate::local::test_support::{block_on, publish_request, recording_host, unpublish_request};
    use crate::mount::MountCall;

    fn inline(path: &str, path_type: Option<&str>) -> VolumeSpec {
        let source = HostPathVolumeSource { path: path.to_string(), type_: path_type.map(str::to_string) };
        VolumeSpec::inline(
            Volume { name: "host".to_string(), host_path: Some(source), ..Volume::default() },
            "ns",
        )
    }

    #[test]
    fn types_parse_from_their_api_spelling() {
        let cases = [
            ("", Some(HostPathType::Unset)),
            ("DirectoryOrCreate", Some(HostPathType::DirectoryOrCreate)),
            ("Directory", Some(HostPathType::Directory)),
            ("FileOrCreate", Some(HostPathType::FileOrCreate)),
            ("File", Some(HostPathType::File)),
            ("Socket", Some(HostPathType::Socket)),
            ("CharDevice", Some(HostPathType::CharDevice)),
            ("BlockDevice", Some(HostPathType::BlockDevice)),
            ("directory", None),
            ("Dir", None),
            ("Unset", None),
        ];
        for (text, expected) in cases {
            assert_eq!(HostPathType::parse(text), expected, "{text:?}");
        }
    }

    #[test]
    fn type_decisions_follow_upstream_check_type() {
        use FileKind::*;
        use HostPathType as T;
        use TypeDecision::*;
        let mismatch = |expected, found| Mismatch { expected, found };
        let cases = [
            (T::Unset, None, Missing),
            (T::Unset, Some(Fifo), Use(Fifo)),
            (T::Unset, Some(Directory), Use(Directory)),
            (T::DirectoryOrCreate, None, CreateDirectory),
            (T::DirectoryOrCreate, Some(Directory), Use(Directory)),
            (T::DirectoryOrCreate, Some(File), mismatch("directory", File)),
            (T::Directory, None, Missing),
            (T::Directory, Some(Directory), Use(Directory)),
            (T::Directory, Some(Socket), mismatch("directory", Socket)),
            (T::FileOrCreate, None, CreateFile),
            (T::FileOrCreate, Some(File), Use(File)),
            (T::FileOrCreate, Some(Directory), mismatch("file", Directory)),
            (T::File, None, Missing),
            (T::File, Some(File), Use(File)),
            (T::File, Some(CharDevice), mismatch("file", CharDevice)),
            (T::Socket, None, Missing),
            (T::Socket, Some(Socket), Use(Socket)),
            (T::Socket, Some(File), mismatch("socket file", File)),
            (T::CharDevice, None, Missing),
            (T::CharDevice, Some(CharDevice), Use(CharDevice)),
            (T::CharDevice, Some(BlockDevice), mismatch("character device", BlockDevice)),
            (T::BlockDevice, None, Missing),
            (T::BlockDevice, Some(BlockDevice), Use(BlockDevice)),
            (T::BlockDevice, Some(CharDevice), mismatch("block device", CharDevice)),
            (T::BlockDevice, Some(Fifo), mismatch("block device", Fifo)),
        ];
        for (path_type, found, expected) in cases {
            assert_eq!(decide(path_type, found), expected, "{path_type:?} with {found:?}");
        }
    }

    #[test]
    fn check_errors_use_upstream_wording() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        let err = prepare_host_path(&file, HostPathType::Directory).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("hostPath type check failed: {} is not a directory, it's a File", file.display())
        );
        let err = prepare_host_path(Path::new("/dev/null"), HostPathType::Socket).unwrap_err();
        assert_eq!(
            err.to_string(),
            "hostPath type check failed: /dev/null is not a socket file, it's a CharDevice"
        );
        let missing = dir.path().join("missing");
        let err = prepare_host_path(&missing, HostPathType::File).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("hostPath {} doesn't exist (hostPath type File)", missing.display())
        );
    }

    #[test]
    fn create_types_create_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let new_dir = dir.path().join("a").join("b");
        assert_eq!(
            prepare_host_path(&new_dir, HostPathType::DirectoryOrCreate).unwrap(),
            FileKind::Directory
        );
        let mode = fs::metadata(&new_dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o755, 0, "mode {mode:o} is wider than 0755");

        let new_file = dir.path().join("a").join("file");
        assert_eq!(prepare_host_path(&new_file, HostPathType::FileOrCreate).unwrap(), FileKind::File);
        let mode = fs::metadata(&new_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o644, 0, "mode {mode:o} is wider than 0644");
        assert_eq!(fs::metadata(&new_file).unwrap().len(), 0);

        // FileOrCreate does not create the file's directory, as upstream.
        let orphan = dir.path().join("no-such-dir").join("file");
        let err = prepare_host_path(&orphan, HostPathType::FileOrCreate).unwrap_err();
        assert!(err.to_string().starts_with(&format!("cannot create file {}", orphan.display())), "{err}");
        assert!(!dir.path().join("no-such-dir").exists());
    }

    #[test]
    fn specs_upstream_refuses_are_refused() {
        let cases = [
            (inline("/data", Some("Folder")), "inline volume \"host\": Folder is an invalid volume type"),
            (
                inline("/data/../etc", None),
                "inline volume \"host\": invalid HostPath `/data/../etc`: must not contain '..'",
            ),
            (
                inline("data", None),
                "inline volume \"host\": invalid HostPath `data`: must be an absolute path",
            ),
            (
                VolumeSpec::inline(Volume { name: "host".into(), ..Volume::default() }, "ns"),
                "it is not a hostPath volume",
            ),
        ];
        let (_root, host, _) = recording_host();
        let plugin = HostPathPlugin::new(host);
        for (spec, expected) in cases {
            let err =
                block_on(plugin.publish(&publish_request(&spec, Path::new("/nowhere"), false))).unwrap_err();
            assert!(err.to_string().ends_with(expected), "{err} does not end with {expected}");
        }
    }

    #[test]
    fn publish_binds_directories_and_files_and_is_idempotent() {
        let (root, host, mounter) = recording_host();
        let plugin = HostPathPlugin::new(host);
        let data = root.path().join("data");
        let spec = inline(data.to_str().unwrap(), Some("DirectoryOrCreate"));
        let target = root.path().join("pods/u/volumes/kubernetes.io~host-path/host");
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        assert!(target.is_dir());
        assert_eq!(
            mounter.calls(),
            [MountCall::Bind { source: data.clone(), target: target.clone(), read_only: false }]
        );

        let file_target = root.path().join("pods/u/volumes/kubernetes.io~host-path/null");
        let null = inline("/dev/null", Some("CharDevice"));
        block_on(plugin.publish(&publish_request(&null, &file_target, false))).unwrap();
        assert!(file_target.is_file(), "a non-directory is published on an empty file");
    }

    #[test]
    fn read_only_comes_from_the_request_or_the_spec() {
        let (root, host, mounter) = recording_host();
        let plugin = HostPathPlugin::new(host);
        let data = root.path().join("data");
        fs::create_dir(&data).unwrap();
        let spec = inline(data.to_str().unwrap(), None);
        let cases = [(false, false, false), (true, false, true), (false, true, true)];
        for (i, (request_ro, spec_ro, expected)) in cases.into_iter().enumerate() {
            let spec = spec.clone().with_read_only(spec_ro);
            let target = root.path().join(format!("target-{i}"));
            block_on(plugin.publish(&publish_request(&spec, &target, request_ro))).unwrap();
            let last = mounter.calls().pop().unwrap();
            assert_eq!(
                last,
                MountCall::Bind { source: data.clone(), target, read_only: expected },
                "case {i}"
            );
        }
    }

    #[test]
    fn persistent_volumes_are_served_and_named_by_path() {
        let (_root, host, _) = recording_host();
        let plugin = HostPathPlugin::new(host);
        let pv = PersistentVolume {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("pv".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource { path: "/srv/pv".into(), type_: None }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = VolumeSpec::persistent(pv);
        assert!(plugin.can_support(&spec));
        assert_eq!(plugin.volume_name(&spec).unwrap(), "/srv/pv");
        assert!(plugin.capabilities().persistent && plugin.capabilities().mountable);
        assert!(!plugin.capabilities().device_mountable && !plugin.capabilities().attachable);
        assert_eq!(plugin.access_modes(), [AccessMode::ReadWriteOnce]);
        assert!(!plugin.can_support(&VolumeSpec::inline(Volume::default(), "ns")));
    }

    #[test]
    fn unpublish_unmounts_removes_the_target_and_keeps_host_data() {
        let (root, host, mounter) = recording_host();
        let plugin = HostPathPlugin::new(host);
        let data = root.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::write(data.join("keep"), b"x").unwrap();
        let spec = inline(data.to_str().unwrap(), Some("Directory"));
        let target = root.path().join("target");
        block_on(plugin.publish(&publish_request(&spec, &target, false))).unwrap();
        block_on(plugin.unpublish(&unpublish_request(&target))).unwrap();
        block_on(plugin.unpublish(&unpublish_request(&target))).unwrap();
        assert!(!target.exists());
        assert!(data.join("keep").exists());
        assert_eq!(mounter.calls().last(), Some(&MountCall::Unmount { target: target.clone() }));
        assert_eq!(mounter.calls().len(), 2);
    }
}
