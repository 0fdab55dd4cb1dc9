//! Service-account tokens for drivers whose CSIDriver lists `tokenRequests`: the seam that mints them (the cluster's TokenRequest API); the pure parts live in [`kvol_csi_rules::tokens`].

pub use kvol_csi_rules::tokens::{SERVICE_ACCOUNT_TOKENS_KEY, TokenAudience, tokens_value};

pub use kvol_plugin::tokens::TokenSource;
