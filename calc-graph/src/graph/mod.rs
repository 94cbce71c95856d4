//! The calculation graph: datastore updates in, ordered dataplane updates out.
