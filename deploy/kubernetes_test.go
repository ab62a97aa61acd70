package deploy

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// deploy/kubernetes/*.yaml, decoded into the few fields the checks read.

type k8sMeta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace"`
	Labels    map[string]string `yaml:"labels"`
}

type k8sObject struct {
	file       string
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   k8sMeta           `yaml:"metadata"`
	Spec       yaml.Node         `yaml:"spec"`
	StringData map[string]string `yaml:"stringData"`
	Data       map[string]string `yaml:"data"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// intOrString is a port, a PDB count, and the like: a number or a name.
type intOrString string

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a number or a name", n.Line)
	}
	*v = intOrString(n.Value)
	return nil
}

type deploymentSpec struct {
	Replicas *int          `yaml:"replicas"`
	Selector labelSelector `yaml:"selector"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               k8sSecurity    `yaml:"securityContext"`
	Containers                    []k8sContainer `yaml:"containers"`
}

type k8sSecurity struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type k8sContainer struct {
	Name  string          `yaml:"name"`
	Image string          `yaml:"image"`
	Ports []containerPort `yaml:"ports"`
	Env   []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext k8sSecurity `yaml:"securityContext"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type servicePort struct {
	Port       int         `yaml:"port"`
	TargetPort intOrString `yaml:"targetPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []servicePort     `yaml:"ports"`
}

type pdbSpec struct {
	MinAvailable   *intOrString  `yaml:"minAvailable"`
	MaxUnavailable *intOrString  `yaml:"maxUnavailable"`
	Selector       labelSelector `yaml:"selector"`
}

func parseManifests(f files, p *problems) []k8sObject {
	var objs []k8sObject
	for _, name := range slices.Sorted(maps.Keys(f)) {
		if !strings.HasPrefix(name, kubeDir+"/") {
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(f[name]))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				p.add("%s: %v", name, err)
				break
			}
			if o.Kind == "" {
				continue
			}
			o.file = name
			objs = append(objs, o)
		}
	}
	return objs
}

// subset reports whether every label of sel is in labels (and sel selects
// something).
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkKubernetes(f files, s settings, p *problems) {
	objs := parseManifests(f, p)
	byKind := map[string][]k8sObject{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "Secret"} {
		if len(byKind[kind]) != 1 {
			p.add("%s: %d objects of kind %s, want one", kubeDir, len(byKind[kind]), kind)
			return
		}
	}
	dep := byKind["Deployment"][0]
	var spec deploymentSpec
	if err := dep.Spec.Decode(&spec); err != nil {
		p.add("%s: Deployment: %v", dep.file, err)
		return
	}
	where := dep.file + ": Deployment " + dep.Metadata.Name
	pod := spec.Template.Spec
	podLabels := spec.Template.Metadata.Labels
	if !subset(spec.Selector.MatchLabels, podLabels) {
		p.add("%s: selector %v does not select its own pods %v", where, spec.Selector.MatchLabels, podLabels)
	}
	if len(pod.Containers) != 1 {
		p.add("%s: %d containers, want the relay alone", where, len(pod.Containers))
		return
	}
	c := pod.Containers[0]
	env := map[string]string{}
	secretRefs := map[string][2]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[e.Name] = *e.Value
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "(secret)"
			secretRefs[e.Name] = [2]string{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key}
		}
	}

	replicas := 1
	if spec.Replicas != nil {
		replicas = *spec.Replicas
	}
	if replicas < 2 {
		p.add("%s: replicas %d, want two or more for a fleet", where, replicas)
	}
	if env["FN_RELAY_REPLICAS"] != strconv.Itoa(replicas) {
		p.add("%s: FN_RELAY_REPLICAS=%q, want %d, the Deployment's replicas", where, env["FN_RELAY_REPLICAS"], replicas)
	}
	if env["FN_REDIS_URL"] == "" {
		p.add("%s: no FN_REDIS_URL; several replicas wake each other through Redis", where)
	}
	secret := byKind["Secret"][0]
	for _, name := range []string{"FN_DATABASE_URL", "FN_ISSUER_KEYS"} {
		ref, ok := secretRefs[name]
		if !ok {
			p.add("%s: %s is not read from a Secret", where, name)
			continue
		}
		_, inString := secret.StringData[ref[1]]
		_, inData := secret.Data[ref[1]]
		if ref[0] != secret.Metadata.Name || (!inString && !inData) {
			p.add("%s: %s reads Secret %s key %s, which %s does not define", where, name, ref[0], ref[1], secret.file)
		}
	}

	// Ports: the API port is FN_LISTEN's, and probes and the Service aim
	// at it by name or number.
	if host, _, _ := net.SplitHostPort(env["FN_LISTEN"]); host != "0.0.0.0" {
		p.add("%s: FN_LISTEN=%q, want 0.0.0.0:PORT so the kubelet and Service reach it", where, env["FN_LISTEN"])
	}
	apiPort := s.listenPort(env)
	var declared bool
	isAPIPort := func(v intOrString) bool {
		for _, cp := range c.Ports {
			if (string(v) == cp.Name || string(v) == strconv.Itoa(cp.ContainerPort)) && strconv.Itoa(cp.ContainerPort) == apiPort {
				return true
			}
		}
		return false
	}
	for _, cp := range c.Ports {
		declared = declared || strconv.Itoa(cp.ContainerPort) == apiPort
	}
	if !declared {
		p.add("%s: no containerPort for FN_LISTEN's port %s", where, apiPort)
	}
	if _, mport, _ := net.SplitHostPort(env["FN_METRICS_ADDR"]); mport != "" && !slices.ContainsFunc(c.Ports, func(cp containerPort) bool {
		return strconv.Itoa(cp.ContainerPort) == mport
	}) {
		p.add("%s: no containerPort for FN_METRICS_ADDR's port %s", where, mport)
	}
	for _, pr := range []struct {
		name, path string
		probe      *k8sProbe
	}{{"readiness", "/ready", c.ReadinessProbe}, {"liveness", "/live", c.LivenessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			p.add("%s: no %s probe, want an HTTP GET of %s on the API port %s", where, pr.name, pr.path, apiPort)
			continue
		}
		if get := pr.probe.HTTPGet; get.Path != pr.path || !isAPIPort(get.Port) {
			p.add("%s: %s probe GETs %s on port %s, want %s on the API port %s", where, pr.name, get.Path, get.Port, pr.path, apiPort)
		}
	}

	grace, err := s.grace(env)
	if err != nil {
		p.add("%s: FN_SHUTDOWN_GRACE: %v", where, err)
	}
	var sleep time.Duration
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		sleep = time.Duration(ps.Sleep.Seconds) * time.Second
	}
	// The countdown starts before preStop; the drain starts after it.
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < sleep+grace+drainMargin {
		p.add("%s: terminationGracePeriodSeconds %v, want at least the preStop sleep (%v) + FN_SHUTDOWN_GRACE (%v) + %v", where, derefInt(g), sleep, grace, drainMargin)
	}

	nonRoot := (pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot) ||
		(c.SecurityContext.RunAsNonRoot != nil && *c.SecurityContext.RunAsNonRoot)
	for _, sc := range []k8sSecurity{pod.SecurityContext, c.SecurityContext} {
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot || sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			nonRoot = false
		}
	}
	if !nonRoot {
		p.add("%s: want runAsNonRoot: true and no runAsUser 0", where)
	}
	if v := c.SecurityContext.ReadOnlyRootFilesystem; v == nil || !*v {
		p.add("%s: want readOnlyRootFilesystem: true", where)
	}
	if v := c.SecurityContext.AllowPrivilegeEscalation; v == nil || *v {
		p.add("%s: want allowPrivilegeEscalation: false", where)
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
		p.add("%s: capabilities drop %q, want ALL", where, c.SecurityContext.Capabilities.Drop)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" || c.Resources.Limits[r] == "" {
			p.add("%s: resources want a %s request and limit", where, r)
		}
	}

	svc := byKind["Service"][0]
	var ss serviceSpec
	if err := svc.Spec.Decode(&ss); err != nil {
		p.add("%s: Service: %v", svc.file, err)
	} else {
		if !subset(ss.Selector, podLabels) {
			p.add("%s: Service %s selects %v, not the relay pods %v", svc.file, svc.Metadata.Name, ss.Selector, podLabels)
		}
		if len(ss.Ports) == 0 || !slices.ContainsFunc(ss.Ports, func(sp servicePort) bool {
			return isAPIPort(sp.TargetPort)
		}) {
			p.add("%s: Service %s targets no port that is the relay's API port %s", svc.file, svc.Metadata.Name, apiPort)
		}
	}

	pdb := byKind["PodDisruptionBudget"][0]
	var ps pdbSpec
	if err := pdb.Spec.Decode(&ps); err != nil {
		p.add("%s: PodDisruptionBudget: %v", pdb.file, err)
		return
	}
	where = pdb.file + ": PodDisruptionBudget " + pdb.Metadata.Name
	if !subset(ps.Selector.MatchLabels, podLabels) {
		p.add("%s: selects %v, not the relay pods %v", where, ps.Selector.MatchLabels, podLabels)
	}
	switch {
	case (ps.MinAvailable == nil) == (ps.MaxUnavailable == nil):
		p.add("%s: want exactly one of minAvailable and maxUnavailable", where)
	case ps.MinAvailable != nil:
		// minAvailable equal to the replicas blocks every node drain.
		if n, err := strconv.Atoi(string(*ps.MinAvailable)); err != nil || n < 1 || n >= replicas {
			p.add("%s: minAvailable %q, want from 1 to replicas-1 (%d)", where, *ps.MinAvailable, replicas-1)
		}
	default:
		if n, err := strconv.Atoi(string(*ps.MaxUnavailable)); err != nil || n < 1 || n >= replicas {
			p.add("%s: maxUnavailable %q, want from 1 to replicas-1 (%d)", where, *ps.MaxUnavailable, replicas-1)
		}
	}

	ns := dep.Metadata.Namespace
	for _, o := range objs {
		if o.Metadata.Namespace != ns {
			p.add("%s: %s %s is in namespace %q, the Deployment in %q", o.file, o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
	}
}

func derefInt(p *int) any {
	if p == nil {
		return "unset"
	}
	return *p
}
