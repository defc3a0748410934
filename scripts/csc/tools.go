//go:build tools

// Package tools names the command this module builds, so that go.mod and
// go.sum keep its modules.
package tools

import _ "github.com/rexray/gocsi/csc"
