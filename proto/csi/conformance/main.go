// Command conformance checks that pillar-csi's csi.v1 contract
// (proto/csi/v1/csi.proto) is wire-compatible with the official CSI spec's
// Go bindings at the version pinned in go.mod.
//
// It renders both file descriptors as the same sorted listing, one line per
// message, field, oneof, enum value, extension and RPC, carrying what the wire
// and the generated code depend on: field numbers, types, labels, oneof
// membership, map key and value types, reserved numbers and names, streaming,
// and the options set on each element (csi_secret, alpha_*, deprecated). The
// official side is the descriptor the upstream package registers
// (csi.File_csi_proto); ours is the FileDescriptorSet protoc writes for our
// .proto (protoc --include_imports --descriptor_set_out). File-level options
// (go_package and the like) and the file's path are left out: they do not
// reach the wire.
//
//	conformance -ours csi.pb            compare; exit 1 and list every difference
//	conformance -ours csi.pb -print ours    print one listing (official|ours)
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// oursPath is the path of our file inside the descriptor set, as protoc
// names it when run with -I proto.
const oursPath = "csi/v1/csi.proto"

func main() {
	oursFile := flag.String("ours", "", "FileDescriptorSet of proto/csi/v1/csi.proto (protoc --include_imports --descriptor_set_out)")
	printOnly := flag.String("print", "", "print one listing instead of comparing: official or ours")
	flag.Parse()

	official := listing(csi.File_csi_proto)
	if *printOnly == "official" {
		fmt.Print(strings.Join(official, "\n") + "\n")
		return
	}
	if *oursFile == "" {
		fail("conformance: -ours is required (see the package doc)")
	}
	fd, err := loadOurs(*oursFile)
	if err != nil {
		fail("conformance: %v", err)
	}
	ours := listing(fd)
	switch *printOnly {
	case "":
	case "ours":
		fmt.Print(strings.Join(ours, "\n") + "\n")
		return
	default:
		fail("conformance: -print takes official or ours, not %q", *printOnly)
	}

	onlyOfficial, onlyOurs := difference(official, ours), difference(ours, official)
	for _, l := range onlyOfficial {
		fmt.Printf("- official only: %s\n", l)
	}
	for _, l := range onlyOurs {
		fmt.Printf("+ ours only:     %s\n", l)
	}
	c := count(official)
	if c["rpc"] == 0 || c["field"] == 0 {
		fail("conformance: the official listing is empty (%d lines); nothing was compared", len(official))
	}
	if len(onlyOfficial)+len(onlyOurs) > 0 {
		fmt.Printf("csi conformance: FAILED, %d lines differ (official csi.v1 %s vs %s)\n",
			len(onlyOfficial)+len(onlyOurs), csiVersion(), oursPath)
		os.Exit(1)
	}
	fmt.Printf("csi conformance: %s identical to the official csi.v1 (spec %s): %d lines compared: "+
		"%d services, %d RPCs, %d messages, %d fields (%d in oneofs, %d maps), %d enums, %d enum values, %d extensions\n",
		oursPath, csiVersion(), len(official), c["service"], c["rpc"], c["message"], c["field"],
		c["oneof-field"], c["map-field"], c["enum"], c["enum_value"], c["extension"])
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// csiVersion is the version of the spec module this program was built with,
// as go.mod pins it.
func csiVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "github.com/container-storage-interface/spec" {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}

// loadOurs reads a FileDescriptorSet and returns our csi.v1 file from it.
// Options are decoded with the global registry, which holds the official
// csi.v1 extensions: an option of ours under another number than the
// official one stays an unknown field and shows up as such in the listing.
func loadOurs(path string) (protoreflect.FileDescriptor, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var set descriptorpb.FileDescriptorSet
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(raw, &set); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fd, err := files.FindFileByPath(oursPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return fd, nil
}

// listing renders a file descriptor as sorted lines.
func listing(fd protoreflect.FileDescriptor) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	add("file syntax=%s package=%s", fd.Syntax(), fd.Package())
	for i := 0; i < fd.Imports().Len(); i++ {
		add("import %s", fd.Imports().Get(i).Path())
	}
	extensions(fd.Extensions(), add)
	enums(fd.Enums(), add)
	messages(fd.Messages(), add)
	for i := 0; i < fd.Services().Len(); i++ {
		s := fd.Services().Get(i)
		add("service %s%s", s.FullName(), options(s.Options()))
		for j := 0; j < s.Methods().Len(); j++ {
			m := s.Methods().Get(j)
			add("rpc %s (%s%s) returns (%s%s)%s", m.FullName(),
				stream(m.IsStreamingClient()), m.Input().FullName(),
				stream(m.IsStreamingServer()), m.Output().FullName(), options(m.Options()))
		}
	}
	sort.Strings(out)
	return out
}

func stream(yes bool) string {
	if yes {
		return "stream "
	}
	return ""
}

func extensions(xs protoreflect.ExtensionDescriptors, add func(string, ...any)) {
	for i := 0; i < xs.Len(); i++ {
		x := xs.Get(i)
		add("extension %s = %d %s%s extends %s", x.FullName(), x.Number(), label(x), fieldType(x), x.ContainingMessage().FullName())
	}
}

func enums(es protoreflect.EnumDescriptors, add func(string, ...any)) {
	for i := 0; i < es.Len(); i++ {
		e := es.Get(i)
		var ranges []string
		for j := 0; j < e.ReservedRanges().Len(); j++ {
			r := e.ReservedRanges().Get(j) // inclusive at both ends
			ranges = append(ranges, fmt.Sprintf("%d-%d", r[0], r[1]))
		}
		add("enum %s%s%s", e.FullName(), reserved(ranges, e.ReservedNames()), options(e.Options()))
		for j := 0; j < e.Values().Len(); j++ {
			v := e.Values().Get(j)
			add("enum_value %s.%s = %d%s", e.FullName(), v.Name(), v.Number(), options(v.Options()))
		}
	}
}

func messages(ms protoreflect.MessageDescriptors, add func(string, ...any)) {
	for i := 0; i < ms.Len(); i++ {
		m := ms.Get(i)
		if m.IsMapEntry() {
			continue // rendered as map<K, V> on its field
		}
		var ext []string
		for j := 0; j < m.ExtensionRanges().Len(); j++ {
			r := m.ExtensionRanges().Get(j)
			ext = append(ext, fmt.Sprintf("%d-%d", r[0], r[1]-1))
		}
		extRanges := ""
		if len(ext) > 0 {
			extRanges = " extensions=" + strings.Join(ext, ",")
		}
		var ranges []string
		for j := 0; j < m.ReservedRanges().Len(); j++ {
			r := m.ReservedRanges().Get(j) // end exclusive
			ranges = append(ranges, fmt.Sprintf("%d-%d", r[0], r[1]-1))
		}
		add("message %s%s%s%s", m.FullName(), reserved(ranges, m.ReservedNames()), extRanges, options(m.Options()))
		for j := 0; j < m.Oneofs().Len(); j++ {
			o := m.Oneofs().Get(j)
			kind := "oneof"
			if o.IsSynthetic() {
				kind = "oneof(synthetic)"
			}
			add("%s %s%s", kind, o.FullName(), options(o.Options()))
		}
		for j := 0; j < m.Fields().Len(); j++ {
			f := m.Fields().Get(j)
			in := ""
			if o := f.ContainingOneof(); o != nil {
				in = " in " + string(o.Name())
			}
			add("field %s = %d %s%s%s%s", f.FullName(), f.Number(), label(f), fieldType(f), in, options(f.Options()))
		}
		extensions(m.Extensions(), add)
		enums(m.Enums(), add)
		messages(m.Messages(), add)
	}
}

func label(f protoreflect.FieldDescriptor) string {
	switch {
	case f.IsMap():
		return ""
	case f.Cardinality() == protoreflect.Repeated:
		return "repeated "
	case f.HasOptionalKeyword():
		return "optional "
	case f.Cardinality() == protoreflect.Required:
		return "required "
	}
	return ""
}

func fieldType(f protoreflect.FieldDescriptor) string {
	if f.IsMap() {
		return fmt.Sprintf("map<%s, %s>", fieldType(f.MapKey()), fieldType(f.MapValue()))
	}
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return fmt.Sprintf("%s %s", f.Kind(), f.Message().FullName())
	case protoreflect.EnumKind:
		return fmt.Sprintf("enum %s", f.Enum().FullName())
	}
	return f.Kind().String()
}

// reserved renders reserved number ranges (inclusive) and names.
func reserved(ranges []string, names protoreflect.Names) string {
	parts := ranges
	for i := 0; i < names.Len(); i++ {
		parts = append(parts, string(names.Get(i)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " reserved=" + strings.Join(parts, ",")
}

// options renders every option set on an element, standard and extension
// alike, sorted; unknown option bytes (an extension under a number nobody
// declared) are shown raw so they cannot pass unnoticed.
func options(m proto.Message) string {
	if m == nil {
		return ""
	}
	r := m.ProtoReflect()
	if !r.IsValid() {
		return ""
	}
	var parts []string
	r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		if fd.IsExtension() {
			name = "(" + string(fd.FullName()) + ")"
		}
		parts = append(parts, fmt.Sprintf("%s=%v", name, v.Interface()))
		return true
	})
	if u := r.GetUnknown(); len(u) > 0 {
		parts = append(parts, fmt.Sprintf("unknown=%x", []byte(u)))
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	return " [" + strings.Join(parts, " ") + "]"
}

// difference returns the lines of a that are not in b.
func difference(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, l := range b {
		in[l] = true
	}
	var out []string
	for _, l := range a {
		if !in[l] {
			out = append(out, l)
		}
	}
	return out
}

// count tallies the listing's lines by kind.
func count(lines []string) map[string]int {
	c := map[string]int{}
	for _, l := range lines {
		kind, rest, _ := strings.Cut(l, " ")
		c[kind]++
		if kind == "field" {
			if strings.Contains(rest, " in ") {
				c["oneof-field"]++
			}
			if strings.Contains(rest, " map<") {
				c["map-field"]++
			}
		}
	}
	return c
}
