//! Calico selector language: parser, evaluator and canonical form.
