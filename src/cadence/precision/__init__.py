"""Mixed precision: `choice` parses and checks the requested precision once into a value;
`policy` applies it (autocast, grad scaler, fp32 outputs); `fp8` converts models for FP8."""
