package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"slices"
)

// Parse parses args into fs, then gives every flag that args left out the
// value of its environment variable (envOf(name); "" for a flag without
// one), when that variable is set and not empty: a flag wins over the
// environment, which wins over the flag's default. It returns the
// VAR=value assignments it made, in the order of fs's flags.
//
// Every error is one line that names where the value came from: the flag
// package's own for the command line ("invalid value "x" for flag -wait:
// ..."), a *FlagError, VAR="value": ... for the environment. On -h it
// writes fs's usage to fs's output and returns flag.ErrHelp; on an error
// it writes nothing, the caller reports the error.
func Parse(fs *flag.FlagSet, args []string, getenv func(string) string, envOf func(flag string) string) ([]string, error) {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return nil, err
	}
	if err != nil {
		return nil, &FlagError{err}
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var applied []string
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := envOf(f.Name)
		if envErr != nil || given[f.Name] || name == "" {
			return
		}
		v := getenv(name)
		if v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			return
		}
		applied = append(applied, name+"="+v)
	})
	return applied, envErr
}

// FlagError is a mistake on the command line (an unknown flag, a bad
// value for one), which commands report differently from a bad value in
// the environment: the person typing can fix it at once.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// Settings returns the table of every setting, in the order the docs show.
func Settings() []Setting { return slices.Clone(settings) }

// Lookup finds the setting of an FN_* variable.
func Lookup(env string) (Setting, bool) {
	i := slices.IndexFunc(settings, func(s Setting) bool { return s.Env == env })
	if i < 0 {
		return Setting{}, false
	}
	return settings[i], true
}

// Check reports whether v is a value the setting accepts, with the error
// its parser gives. The zero Setting, which Lookup returns for a name it
// does not know, accepts nothing.
func (s Setting) Check(v string) error {
	if s.set == nil {
		return errors.New("not a relay setting")
	}
	var c Config
	return s.set(&c, v)
}

// settingValue is a setting as a flag.Value that parses into a Config.
type settingValue struct {
	s Setting
	c *Config
}

// String returns "": the usage text states the default itself.
func (v settingValue) String() string     { return "" }
func (v settingValue) Set(s string) error { return v.s.set(v.c, s) }

// Bind registers one flag per setting on fs, parsing into c. Load and the
// usage of commands that read the configuration use it.
func Bind(fs *flag.FlagSet, c *Config) {
	for _, s := range settings {
		s.bind(fs, c)
	}
}

func (s Setting) bind(fs *flag.FlagSet, c *Config) {
	fs.Var(settingValue{s, c}, s.Flag(), fmt.Sprintf("%s (env %s, default %q)", s.Usage, s.Env, s.Default))
}

// Load reads the configuration: each setting's flag in args wins over its
// FN_* variable, which wins over its default. fs gets one flag per setting
// (the caller may have added its own; positional arguments are left in
// fs.Args()). A bad value is an error of one line that names the flag or
// the variable it came from; so is a combination of settings that cannot
// work together. -h writes the usage and returns flag.ErrHelp.
func Load(fs *flag.FlagSet, args []string, getenv func(string) string) (Config, error) {
	return LoadOnly(fs, args, getenv)
}

// LoadOnly is Load for a command that uses only some settings: envs names
// them (none: every one). The others keep their defaults and are neither
// flags nor read from the environment, so that the command's usage lists
// what it uses and a setting it ignores cannot stop it.
func LoadOnly(fs *flag.FlagSet, args []string, getenv func(string) string, envs ...string) (Config, error) {
	var c Config
	for _, s := range settings {
		if err := s.set(&c, s.Default); err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", s.Env, err)) // a constant; a bad one is a programming error
		}
	}
	envOf := map[string]string{}
	for _, s := range settings {
		if len(envs) > 0 && !slices.Contains(envs, s.Env) {
			continue
		}
		s.bind(fs, &c)
		envOf[s.Flag()] = s.Env
	}
	if _, err := Parse(fs, args, getenv, func(f string) string { return envOf[f] }); err != nil {
		return Config{}, err
	}
	return c, c.validate()
}

// FromEnv returns the configuration an environment alone gives (no flags).
func FromEnv(getenv func(string) string) (Config, error) {
	return Load(flag.NewFlagSet("", flag.ContinueOnError), nil, getenv)
}

// Default returns the configuration with every setting at its default.
func Default() Config {
	c, err := FromEnv(func(string) string { return "" })
	if err != nil {
		panic(err) // the defaults are constants; a bad one is a programming error
	}
	return c
}

// CopyTo sets each field of the struct dst points to from c's field of the
// same name, so a package's own configuration can start at the binary's
// defaults without this package knowing it. It panics when a field of dst
// has no twin of the same type here: a programming error.
func (c Config) CopyTo(dst any) {
	src, d := reflect.ValueOf(c), reflect.ValueOf(dst).Elem()
	for i := range d.NumField() {
		name := d.Type().Field(i).Name
		f := src.FieldByName(name)
		if !f.IsValid() || f.Type() != d.Field(i).Type() {
			panic(fmt.Sprintf("config: %s.%s has no twin in config.Config", d.Type(), name))
		}
		d.Field(i).Set(f)
	}
}
