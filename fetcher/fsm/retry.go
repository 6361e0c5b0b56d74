package fsm

import (
	"math/rand/v2"
	"time"
)

// RetryPolicy decides how often a transition is attempted and how long the
// runner waits between attempts after a plain (retryable) error.
// MaxAttempts counts every attempt, the first included, and also attempts
// interrupted by a crash of the process: a transition that keeps killing the
// daemon ends failed instead of looping forever.
type RetryPolicy struct {
	MaxAttempts int           // total attempts allowed; values < 1 mean 1
	Initial     time.Duration // delay before the second attempt
	Max         time.Duration // cap on any delay
	Multiplier  float64       // growth per attempt; 1 = fixed delay
	Jitter      bool          // spread each delay uniformly over [d/2, d]
}

// Default delays of the constructors; WithDelays overrides them.
const (
	defaultInitialDelay = 500 * time.Millisecond
	defaultMaxDelay     = 30 * time.Second
)

// DefaultRetry is the policy of a transition given no WithRetry: exponential
// backoff, 3 attempts.
var DefaultRetry = ExponentialBackoff(3)

// ExponentialBackoff doubles the delay after each failed attempt (0.5 s,
// 1 s, 2 s, ... capped at 30 s), allowing maxAttempts attempts in all.
func ExponentialBackoff(maxAttempts int) RetryPolicy {
	return RetryPolicy{MaxAttempts: maxAttempts, Initial: defaultInitialDelay, Max: defaultMaxDelay, Multiplier: 2}
}

// ExponentialJitter is ExponentialBackoff with each delay spread over
// [d/2, d], so that runs failing together do not retry in lockstep.
func ExponentialJitter(maxAttempts int) RetryPolicy {
	p := ExponentialBackoff(maxAttempts)
	p.Jitter = true
	return p
}

// FixedRetry waits the same delay between attempts, allowing maxAttempts
// attempts in all.
func FixedRetry(maxAttempts int, delay time.Duration) RetryPolicy {
	return RetryPolicy{MaxAttempts: maxAttempts, Initial: delay, Max: delay, Multiplier: 1}
}

// WithDelays returns a copy of p with the first delay and the cap replaced.
func (p RetryPolicy) WithDelays(initial, maximum time.Duration) RetryPolicy {
	p.Initial, p.Max = initial, maximum
	return p
}

// attempts is MaxAttempts with the floor of 1 applied.
func (p RetryPolicy) attempts() int {
	if p.MaxAttempts < 1 {
		return 1
	}
	return p.MaxAttempts
}

// Delay is the wait after failed attempt number failed (1-based) before the
// next one.
func (p RetryPolicy) Delay(failed int) time.Duration {
	d := float64(p.Initial)
	mult := p.Multiplier
	if mult < 1 {
		mult = 1
	}
	for i := 1; i < failed && (p.Max <= 0 || d < float64(p.Max)); i++ {
		d *= mult
	}
	if p.Max > 0 && d > float64(p.Max) {
		d = float64(p.Max)
	}
	if d < 0 {
		d = 0
	}
	if p.Jitter && d > 0 {
		d = d/2 + rand.Float64()*d/2
	}
	return time.Duration(d)
}
