//! felixrs's side of the two-pod node of [`felixrs_test_support::node`]: the manifests rendered
//! with `felixrs render`'s code and applied with the real applier. The node itself (namespaces,
//! pods, servers, `connects`) lives in `felixrs-test-support`.
// Each test binary that includes this module uses a subset of it.
#![allow(dead_code, unused_imports)]

use std::path::Path;

use calc_graph::proto::IpVersion;
use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs::cmd::shared::node_view::{SourceArgs, render_node};
use felixrs_test_support::netns::Netns;
pub use felixrs_test_support::node::{ALLOWED_PORT, DENIED_PORT, NODE, TELNET_PORT, connects};
use iptables::apply::{Applier, ApplierConfig, Backend, ExecRunner};
use iptables::render::Renderer;

/// The node world with felixrs's rules applied: `w.renderer`, `w.runner` (through `Deref`).
pub type NodeWorld = felixrs_test_support::node::NodeWorld<Applied>;

/// What the node keeps once programmed.
pub struct Applied {
    pub renderer: Renderer,
    pub runner: ExecRunner,
}

/// The rendered node, not yet applied.
struct Rendered {
    renderer: Renderer,
    backend: Backend,
}

impl felixrs_test_support::node::Dataplane for Rendered {
    type Programmed = Applied;

    fn interface_of(&self, pod: &str) -> String {
        self.renderer
            .local_endpoints()
            .find(|e| e.id.name.contains(pod))
            .map(|e| e.interface_name.clone())
            .unwrap_or_else(|| panic!("no endpoint for {pod}"))
    }

    fn program(self, node: &Netns) -> Applied {
        let runner = ExecRunner::in_netns(node.name()).unwrap();
        for v in [IpVersion::V4, IpVersion::V6] {
            let mut applier = Applier::new(
                runner.clone(),
                ApplierConfig {
                    family: v,
                    backend: self.backend,
                    ..ApplierConfig::default()
                },
            );
            applier.apply(self.renderer.desired_ref(v)).expect("apply");
        }
        Applied {
            renderer: self.renderer,
            runner,
        }
    }
}

/// `NodeWorld::new(backend)` / `NodeWorld::with_dataplane(backend, &args)`.
pub trait FelixrsNode: Sized {
    fn new(backend: Backend) -> Self {
        Self::with_dataplane(backend, &DataplaneArgs::default())
    }

    /// The node rendered with `args` (e.g. `--log-denied`).
    fn with_dataplane(backend: Backend, args: &DataplaneArgs) -> Self;
}

impl FelixrsNode for NodeWorld {
    fn with_dataplane(backend: Backend, args: &DataplaneArgs) -> NodeWorld {
        NodeWorld::build(|dir| Rendered {
            renderer: render_with(dir, args),
            backend,
        })
    }
}

/// The node with `extra` (YAML) written next to the node's manifests before they are rendered.
pub fn with_manifest(backend: Backend, extra: &str) -> NodeWorld {
    NodeWorld::build(|dir| {
        std::fs::write(dir.join("extra.yaml"), extra).unwrap();
        Rendered {
            renderer: render_with(dir, &DataplaneArgs::default()),
            backend,
        }
    })
}

/// The node with `extra` (YAML) beside the node's manifests, rendered with `args`.
pub fn with_manifest_dataplane(backend: Backend, extra: &str, args: &DataplaneArgs) -> NodeWorld {
    NodeWorld::build(|dir| {
        std::fs::write(dir.join("extra.yaml"), extra).unwrap();
        Rendered {
            renderer: render_with(dir, args),
            backend,
        }
    })
}

pub fn render_with(dir: &Path, args: &DataplaneArgs) -> Renderer {
    let view =
        render_node(&SourceArgs::manifests(vec![dir.to_path_buf()]), NODE, args).expect("render");
    assert!(view.problems.is_empty(), "{:?}", view.problems);
    view.renderer
}
