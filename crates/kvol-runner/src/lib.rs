//! Runs a node's pods through CRI, getting their volumes only through kvol's runtime API.
