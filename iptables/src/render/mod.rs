//! Renderer: calc-graph output to desired chains and IP sets.
