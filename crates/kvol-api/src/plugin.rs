//! The in-tree volume plugins that can migrate to CSI, with their names and gates.

use std::fmt;

/// An in-tree volume plugin for which kvol has a CSI translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MigratablePlugin {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    Vsphere,
    Portworx,
    Rbd,
}

impl MigratablePlugin {
    /// Every migratable plugin, in a fixed order used for listings and lookups.
    pub const ALL: [MigratablePlugin; 8] = [
        MigratablePlugin::AwsEbs,
        MigratablePlugin::GcePd,
        MigratablePlugin::AzureDisk,
        MigratablePlugin::AzureFile,
        MigratablePlugin::Cinder,
        MigratablePlugin::Vsphere,
        MigratablePlugin::Portworx,
        MigratablePlugin::Rbd,
    ];

    /// The in-tree plugin name, e.g. `kubernetes.io/aws-ebs`.
    pub const fn in_tree_name(self) -> &'static str {
        match self {
            MigratablePlugin::AwsEbs => "kubernetes.io/aws-ebs",
            MigratablePlugin::GcePd => "kubernetes.io/gce-pd",
            MigratablePlugin::AzureDisk => "kubernetes.io/azure-disk",
            MigratablePlugin::AzureFile => "kubernetes.io/azure-file",
            MigratablePlugin::Cinder => "kubernetes.io/cinder",
            MigratablePlugin::Vsphere => "kubernetes.io/vsphere-volume",
            MigratablePlugin::Portworx => "kubernetes.io/portworx-volume",
            MigratablePlugin::Rbd => "kubernetes.io/rbd",
        }
    }

    /// The CSI driver that supersedes the in-tree plugin, e.g. `ebs.csi.aws.com`.
    pub const fn csi_driver(self) -> &'static str {
        match self {
            MigratablePlugin::AwsEbs => "ebs.csi.aws.com",
            MigratablePlugin::GcePd => "pd.csi.storage.gke.io",
            MigratablePlugin::AzureDisk => "disk.csi.azure.com",
            MigratablePlugin::AzureFile => "file.csi.azure.com",
            MigratablePlugin::Cinder => "cinder.csi.openstack.org",
            MigratablePlugin::Vsphere => "csi.vsphere.vmware.com",
            MigratablePlugin::Portworx => "pxd.portworx.com",
            MigratablePlugin::Rbd => "rbd.csi.ceph.com",
        }
    }

    /// The suffix upstream uses in gate names: `CSIMigration<suffix>`, `InTreePlugin<suffix>Unregister`.
    pub const fn gate_suffix(self) -> &'static str {
        match self {
            MigratablePlugin::AwsEbs => "AWS",
            MigratablePlugin::GcePd => "GCE",
            MigratablePlugin::AzureDisk => "AzureDisk",
            MigratablePlugin::AzureFile => "AzureFile",
            MigratablePlugin::Cinder => "OpenStack",
            MigratablePlugin::Vsphere => "vSphere",
            MigratablePlugin::Portworx => "Portworx",
            MigratablePlugin::Rbd => "RBD",
        }
    }

    /// Finds a plugin by its in-tree name (`kubernetes.io/...`); exact match, as upstream.
    pub fn from_in_tree_name(name: &str) -> Option<MigratablePlugin> {
        Self::ALL.into_iter().find(|p| p.in_tree_name() == name)
    }

    /// Finds a plugin by the name of the CSI driver that supersedes it; exact match.
    pub fn from_csi_driver(driver: &str) -> Option<MigratablePlugin> {
        Self::ALL.into_iter().find(|p| p.csi_driver() == driver)
    }
}

impl fmt::Display for MigratablePlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.in_tree_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_for_every_plugin() {
        for p in MigratablePlugin::ALL {
            assert_eq!(MigratablePlugin::from_in_tree_name(p.in_tree_name()), Some(p));
            assert_eq!(MigratablePlugin::from_csi_driver(p.csi_driver()), Some(p));
        }
        assert_eq!(MigratablePlugin::from_in_tree_name("kubernetes.io/AWS-EBS"), None);
        assert_eq!(MigratablePlugin::from_csi_driver("ebs.csi.aws.com "), None);
    }
}
