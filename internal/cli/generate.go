package cli

// The CLI reference, docs/reference/cli, is generated from these commands;
// regenerate it after changing one (tools/clidoc's test fails until then).
//go:generate go run ../../tools/clidoc -out ../../docs/reference/cli
