//! `kvol test-driver`: the node half of Kubernetes' external storage e2e suites, run against one CSI driver on one machine from the driver's own test-driver YAML, no cluster.
//!
//! Rooms:
//! - pure, table-tested: [`definition`] (upstream's driver definition format), [`cases`] (which
//!   case mirrors which upstream test, what it needs, why it is skipped) and [`report`] (the
//!   terminal table, JUnit XML, redaction).
//! - doing it: [`driver`] (the driver's process or socket), [`node`] (kubelet's side, through
//!   kvol's CSI client, CSI volume plugin, standalone provisioner messages and subPath code),
//!   [`data`] (what a container would do with the volume), [`container`] (runc on busybox for
//!   the cases that run one), `checks` (the cases' bodies) and
//!   [`run`] (a whole run).

pub mod cases;
mod checks;
pub mod container;
pub mod data;
pub mod definition;
pub mod driver;
pub mod node;
pub mod report;
pub mod run;

pub use driver::DriverSpec;
pub use run::{Config, RunError, RunReport, run};
