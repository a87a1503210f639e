// Package train is the generic half of a data-parallel training program, for the examples
// and for programs of other modules alike:
//
//   - Setup, one rank's set-up: first the ranks' agreement on their settings, then the comm
//     hook from its parsed -hook spec (ParseHook), DDP around the
//     model with it (bucket cap, the program's DDP options, and for a hook that plans its
//     buckets from measured costs the profile it measures or loads), then the -optim
//     optimizer over DDP's parameters (installed as DDP's corrector when it is one). Its
//     Replica holds the hook, DDP and the optimizer, and the training traffic since.
//   - Loop, the epoch loop: per step the learning rate, the program's Step (forward and DDP
//     backward), DDP's flush on an epoch's last step, the Clip hook and the optimizer step;
//     step records every LogEvery steps (StepRecord), mid-epoch evaluation every EvalEvery,
//     checkpoints every Checkpointer.Every; per epoch the statistics over the ranks, DDP's
//     end of epoch, EndEpoch (evaluation, printing) and a checkpoint; exact resume, mid-epoch
//     included.
//   - Flags, the training flags every program registers the same way (-optim, -schedule,
//     -warmup, -lr, -momentum, -wd, -metrics, -log-every, -plot); CheckWithHook ends a
//     program's flag check with them and its -hook spec.
//   - Main and Program: parse the command line and train in-process with -workers ranks or,
//     under a launcher, one rank per process; RunRanks (every rank of this process on its
//     own goroutine), JoinJob and CloseGroup are the runner's parts.
//   - Startup, a program's start-up from its flag check, data loading and per-ranks trainer:
//     InProcess (check, load, -workers local ranks) and Process (check, join the launched
//     job, load, AutoResume), the same for every program.
//   - MetricsLog, rank 0's -metrics file; Evaluate and ClassifierStep for classifiers.
//   - Output: Loop.Progress shows rank 0's progress, a bar fitted to the terminal or plain
//     periodic lines off one (a file, a launcher's pipe), evaluation included (StartProgress);
//     Printer makes every line a JSON object under -log-format json (Print for a line with
//     fields); under Main the first SIGINT or SIGTERM stops the loop at the next step, after a
//     checkpoint with -checkpoint (StoppedError), and a second one at once.
//
// Every rank of a job must train with the same settings; Setup.New checks it before anything
// else is communicated (comm.AgreeConfig) and fails on every rank with the first setting that
// differs, both values and the ranks. It compares its own settings (world size, the hook's,
// optimizer's and schedule's canonical specs, -lr, -momentum, -wd, -warmup, -bucket-mb,
// -log-every), the program's (Setup.Agree, made with MetaFields and CheckpointFields from what
// its checkpoints require: model, batch, seed, steps, clip…, plus epochs, evaluation and
// checkpoint periods, whether it resumes and the data set's identity) and a digest of the
// model's parameter names and shapes (ParamsDigest). Settings that may differ between ranks
// stay out: the data shard, -data's path, -metrics, -plot, -progress, -log-level,
// -log-format, -profile's path, -record-grads and -keep.
//
// A job restarted by its launcher (spargo launch -restarts, torchrun --max_restarts) resumes
// by itself: AutoResume turns a restart (cluster.Env.RestartCount > 0) of a program with
// -checkpoint into -resume when a complete checkpoint exists, and into a fresh start when the
// failed attempt saved none.
//
// A program brings its model, data and printing: examples/vgg and examples/resnet (through
// examples/internal/cifar), examples/lstm (the PTB language model, and the IMDB classifier
// with -task imdb) and examples/bert are written on this package. The package example
// trains a model of its own with 2 in-process ranks and swaps the comm hook by its spec:
//
//	hook, err := train.ParseHook("topka:density=0.5", 2) // once; each rank builds its own hook
//	rep, err := train.Setup{Hook: hook, Flags: &flags}.New(ctx, g, model)
//	loop := &train.Loop[datasets.Batch]{Group: g, DDP: rep.DDP, Model: model, Optimizer: rep.Optimizer,
//		Epochs: 4, StepsPerEpoch: 25, Batches: batches, Step: train.ClassifierStep(rep.DDP, nn.NewTape(), 4)}
//	err = loop.Run(ctx)
package train
