//! Tests of the public API's dispatch and mappings, across plugins (upstream's translate_test.go).

use serde_json::json;

use crate::plugins::test_support::{pv, vol};
use crate::*;

#[test]
fn name_mappings_both_ways() {
    // Upstream TestPluginNameMappings, for every plugin compiled in.
    for plugin in compiled_in_plugins() {
        assert_eq!(csi_name_from_in_tree_name(plugin.in_tree_name()), Ok(plugin.csi_driver()));
        assert_eq!(in_tree_name_from_csi_name(plugin.csi_driver()), Ok(plugin.in_tree_name()));
        assert!(is_migratable_in_tree_plugin_by_name(plugin.in_tree_name()));
        assert!(is_migrated_csi_driver_by_name(plugin.csi_driver()));
    }
    assert_eq!(
        csi_name_from_in_tree_name("kubernetes.io/nfs"),
        Err(TranslateError::UnknownInTreePlugin("kubernetes.io/nfs".into()))
    );
    assert_eq!(
        in_tree_name_from_csi_name("hostpath.csi.kvol.io"),
        Err(TranslateError::UnknownCsiDriver("hostpath.csi.kvol.io".into()))
    );
    assert!(!is_migratable_in_tree_plugin_by_name("kubernetes.io/AWS-EBS"));
    assert!(!is_migrated_csi_driver_by_name(""));
}

/// (case, PV JSON, expected error)
fn dispatch_error_cases() -> Vec<(&'static str, serde_json::Value, TranslateError)> {
    vec![
        ("no spec", json!({"metadata": {"name": "a"}}), TranslateError::NoPluginForPv { name: "a".into() }),
        (
            "not migratable",
            json!({"metadata": {"name": "b"}, "spec": {"nfs": {"server": "s", "path": "/"}}}),
            TranslateError::NoPluginForPv { name: "b".into() },
        ),
        (
            "two sources",
            json!({"metadata": {"name": "c"}, "spec": {"nfs": {"server": "s", "path": "/"},
                   "gcePersistentDisk": {"pdName": "pd"}}}),
            TranslateError::MultipleSources {
                what: "persistent volume",
                name: "c".into(),
                sources: vec!["gcePersistentDisk", "nfs"],
            },
        ),
        (
            "two migratable sources",
            json!({"metadata": {"name": "d"}, "spec": {"cinder": {"volumeID": "v"},
                   "awsElasticBlockStore": {"volumeID": "vol-1"}}}),
            TranslateError::MultipleSources {
                what: "persistent volume",
                name: "d".into(),
                sources: vec!["awsElasticBlockStore", "cinder"],
            },
        ),
    ]
}

#[test]
fn pv_dispatch_errors_name_the_volume() {
    for (case, input, want) in dispatch_error_cases() {
        let input = pv(input);
        assert_eq!(translate_in_tree_pv_to_csi(&input), Err(want.clone()), "{case}");
        assert!(!is_pv_migratable(&input), "{case}");
    }
}

#[test]
fn csi_to_in_tree_dispatch_errors() {
    let not_csi = pv(json!({"metadata": {"name": "x"}, "spec": {"nfs": {"server": "s", "path": "/"}}}));
    assert_eq!(translate_csi_pv_to_in_tree(&not_csi), Err(TranslateError::NotCsi { name: "x".into() }));
    let native =
        pv(json!({"metadata": {"name": "y"}, "spec": {"csi": {"driver": "d.example", "volumeHandle": "h"}}}));
    assert_eq!(
        translate_csi_pv_to_in_tree(&native),
        Err(TranslateError::UnknownCsiDriver("d.example".into()))
    );
    assert_eq!(
        repair_volume_handle("d.example", "h", "n"),
        Err(TranslateError::UnknownCsiDriver("d.example".into()))
    );
}

#[test]
fn inline_dispatch_errors_name_the_volume() {
    let empty = vol(json!({"name": "scratch", "emptyDir": {}}));
    assert_eq!(
        translate_in_tree_inline_volume_to_csi(&empty, "ns"),
        Err(TranslateError::NoPluginForInline { name: "scratch".into() })
    );
    let two = vol(json!({"name": "v", "emptyDir": {}, "cinder": {"volumeID": "x"}}));
    assert_eq!(
        translate_in_tree_inline_volume_to_csi(&two, "ns"),
        Err(TranslateError::MultipleSources {
            what: "inline volume",
            name: "v".into(),
            sources: vec!["cinder", "emptyDir"]
        })
    );
    assert!(!is_inline_migratable(&empty));
}

#[test]
fn storage_class_of_an_unknown_plugin_is_refused() {
    let sc = crate::plugins::test_support::sc(json!({"provisioner": "kubernetes.io/nfs"}));
    assert_eq!(
        translate_in_tree_storage_class_to_csi("kubernetes.io/nfs", &sc),
        Err(TranslateError::UnknownInTreePlugin("kubernetes.io/nfs".into()))
    );
}

/// Two inline volumes per plugin that differ only in their identity.
fn inline_pairs() -> Vec<(MigratablePlugin, serde_json::Value, serde_json::Value)> {
    use MigratablePlugin::*;
    vec![
        (
            AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "vol-1"}}),
            json!({"awsElasticBlockStore": {"volumeID": "vol-2"}}),
        ),
        (
            GcePd,
            json!({"gcePersistentDisk": {"pdName": "pd-1"}}),
            json!({"gcePersistentDisk": {"pdName": "pd-2"}}),
        ),
        (
            AzureDisk,
            json!({"azureDisk": {"diskName": "a", "diskURI": "/subscriptions/1/resourceGroups/r/providers/Microsoft.Compute/disks/a"}}),
            json!({"azureDisk": {"diskName": "b", "diskURI": "/subscriptions/1/resourceGroups/r/providers/Microsoft.Compute/disks/b"}}),
        ),
        (
            AzureFile,
            json!({"azureFile": {"secretName": "s", "shareName": "one"}}),
            json!({"azureFile": {"secretName": "s", "shareName": "two"}}),
        ),
        (Cinder, json!({"cinder": {"volumeID": "c-1"}}), json!({"cinder": {"volumeID": "c-2"}})),
        (
            Vsphere,
            json!({"vsphereVolume": {"volumePath": "[ds] a.vmdk"}}),
            json!({"vsphereVolume": {"volumePath": "[ds] b.vmdk"}}),
        ),
        (
            Portworx,
            json!({"portworxVolume": {"volumeID": "px-1"}}),
            json!({"portworxVolume": {"volumeID": "px-2"}}),
        ),
        (
            Rbd,
            json!({"rbd": {"monitors": ["m:6789"], "image": "img-1", "pool": "p"}}),
            json!({"rbd": {"monitors": ["m:6789"], "image": "img-2", "pool": "p"}}),
        ),
    ]
}

#[test]
fn inline_translations_get_unique_names_and_filesystem_mode() {
    // Upstream TestTranslateInTreeInlineVolumeToCSINameUniqueness, plus the wrapper's volume mode.
    for (plugin, a, b) in inline_pairs() {
        if !is_compiled_in(plugin) {
            continue;
        }
        let with_name = |mut v: serde_json::Value| {
            v["name"] = json!("same-name");
            vol(v)
        };
        let pa = translate_in_tree_inline_volume_to_csi(&with_name(a), "ns").unwrap();
        let pb = translate_in_tree_inline_volume_to_csi(&with_name(b), "ns").unwrap();
        assert_ne!(pa.metadata.name, pb.metadata.name, "{plugin}: two volumes share a PV name");
        for p in [&pa, &pb] {
            let spec = p.spec.as_ref().unwrap();
            assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"), "{plugin}");
            assert_eq!(spec.csi.as_ref().unwrap().driver, plugin.csi_driver(), "{plugin}");
        }
    }
}

#[test]
fn dispatch_knows_which_plugin_a_spec_belongs_to() {
    for (plugin, a, _) in inline_pairs() {
        let mut v = a.clone();
        v["name"] = json!("v");
        let inline = vol(v);
        let got = in_tree_plugin_from_spec(VolumeSpecRef::Inline(&inline));
        if is_compiled_in(plugin) {
            assert_eq!(got, Ok(plugin));
            assert!(is_inline_migratable(&inline));
        } else {
            assert_eq!(got, Err(TranslateError::NotCompiledIn { plugin, feature: cargo_feature(plugin) }));
        }
        let persistent = pv(json!({"metadata": {"name": "p"}, "spec": a}));
        assert_eq!(
            in_tree_plugin_from_spec(VolumeSpecRef::Persistent(&persistent)).is_ok(),
            is_compiled_in(plugin)
        );
    }
}
