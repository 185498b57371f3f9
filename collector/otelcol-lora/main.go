// otelcol-lora: the OpenTelemetry Collector lora_otel ships, built from the collector's own Go
// modules with exactly the components collector/*.yaml and collector/cloud/*.yaml use.
//
// Build it with collector/build.sh (cached: a second run only checks that the binary is newer
// than these sources). All collector modules are at one release, v0.161.0 (core v1.67.0): the
// newest at which the module proxy serves the loadbalancing, Azure Monitor and Alibaba Cloud
// exporters beside the rest (see collector/README.md for what is not built and why).
package main

import (
	"fmt"
	"os"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/otelcol"
)

// version is the collector release every module of this build is at, and our build's suffix.
const version = "0.161.0-lora"

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-lora",
			Description: "OpenTelemetry Collector for lora_otel (the components collector/*.yaml use)",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
				DefaultScheme: "env",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "otelcol-lora: %v\n", err)
		os.Exit(1)
	}
}
