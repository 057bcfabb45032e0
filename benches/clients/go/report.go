package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func join(v []float64, format string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

// byRound returns field f of the cells of system s and part (and target),
// in round order.
func byRound(cells []cell, s, part string, target int, f func(cell) float64) []float64 {
	var out []float64
	for _, c := range cells {
		if c.System == s && c.Part == part && c.Target == target {
			out = append(out, f(c))
		}
	}
	return out
}

// ratios returns the per-round ratio of system s's f to pgque's f.
func ratios(cells []cell, s, part string, target int, f func(cell) float64) []float64 {
	base := map[int]float64{}
	for _, c := range cells {
		if c.System == "pgque" && c.Part == part && c.Target == target {
			base[c.Round] = f(c)
		}
	}
	var out []float64
	for _, c := range cells {
		if c.System == s && c.Part == part && c.Target == target && base[c.Round] != 0 {
			out = append(out, f(c)/base[c.Round])
		}
	}
	return out
}

var labels = map[string]string{
	"pgque":       "pgque Worker (Go)",
	"river":       "River (defaults: FetchCooldown 100 ms)",
	"river_fc1ms": "River (FetchCooldown 1 ms)",
}

func report(cells []cell, rounds int, rates []int, systems []system, settleWait time.Duration) {
	fmt.Printf("### Drain: end-to-end jobs/s, server CPU per job, dead tuples (%d rounds)\n\n", rounds)
	fmt.Println("| system | jobs per cell | jobs/s (median) | rounds | vs pgque (per round) | server CPU ms/job (median; rounds) | dead tuples after the drain (median; rounds) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	jps := func(c cell) float64 { return c.JobsPerSec }
	cpu := func(c cell) float64 { return c.CPUms }
	dead := func(c cell) float64 { return float64(c.Dead) }
	for _, sys := range systems {
		s := sys.name()
		v := byRound(cells, s, "drain", 0, jps)
		if len(v) == 0 {
			continue
		}
		var jobs int
		for _, c := range cells {
			if c.System == s && c.Part == "drain" {
				jobs = c.Jobs
			}
		}
		r := ratios(cells, s, "drain", 0, jps)
		fmt.Printf("| %s | %d | %.0f | %s | %.2fx (%s) | %.3f (%s) | %.0f (%s) |\n", labels[s], jobs, median(v), join(v, "%.0f"),
			median(r), join(r, "%.2f"), median(byRound(cells, s, "drain", 0, cpu)), join(byRound(cells, s, "drain", 0, cpu), "%.3f"),
			median(byRound(cells, s, "drain", 0, dead)), join(byRound(cells, s, "drain", 0, dead), "%.0f"))
	}
	fmt.Printf("\n### Fixed rate: latency enqueue -> handler start (%d rounds)\n\n", rounds)
	fmt.Println("| target jobs/s | system | achieved jobs/s | received / sent | p50 ms (median; rounds) | p99 ms (median; rounds) | p50 vs pgque | p99 vs pgque | server CPU ms/job | enqueue call p50 ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	p50 := func(c cell) float64 { return c.P50 }
	p99 := func(c cell) float64 { return c.P99 }
	enq := func(c cell) float64 { return c.EnqP50 }
	for _, t := range rates {
		for _, sys := range systems {
			s := sys.name()
			a := byRound(cells, s, "rate", t, jps)
			if len(a) == 0 {
				continue
			}
			var recv, sent int64
			for _, c := range cells {
				if c.System == s && c.Part == "rate" && c.Target == t {
					recv += c.Received
					sent += int64(c.Jobs)
				}
			}
			fmt.Printf("| %d | %s | %.0f | %d / %d | %.1f (%s) | %.1f (%s) | %.2fx | %.2fx | %.3f | %.2f |\n", t, labels[s], median(a), recv, sent,
				median(byRound(cells, s, "rate", t, p50)), join(byRound(cells, s, "rate", t, p50), "%.1f"),
				median(byRound(cells, s, "rate", t, p99)), join(byRound(cells, s, "rate", t, p99), "%.1f"),
				median(ratios(cells, s, "rate", t, p50)), median(ratios(cells, s, "rate", t, p99)),
				median(byRound(cells, s, "rate", t, cpu)), median(byRound(cells, s, "rate", t, enq)))
		}
	}
	var settled []cell
	for _, c := range cells {
		if c.Part == "settle" {
			settled = append(settled, c)
		}
	}
	if len(settled) > 0 {
		fmt.Printf("\n### Dead tuples %s after a drain (one drain of each, after the rounds)\n\n", settleWait)
		fmt.Println("| system | jobs | jobs/s of that drain | dead tuples 1.5 s after it | dead tuples after the wait |")
		fmt.Println("|---|---|---|---|---|")
		for _, c := range settled {
			fmt.Printf("| %s | %d | %.0f | %d | %d |\n", labels[c.System], c.Jobs, c.JobsPerSec, c.Dead, c.DeadLater)
		}
	}
}
