//! `remat-planner`: ONNX import, shapes, training graph, lowering to `remat-solver`.
