// Package deps holds no code: its test keeps test code out of the
// project's binaries.
package deps
