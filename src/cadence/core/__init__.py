"""Foundation: value types (enums), the one settings resolver, the environment helpers, package
availability and versions, input-error messages, lazy exports. Imports nothing of Cadence above it."""
