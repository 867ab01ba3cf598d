"""What the library APIs our users call do, as data: one entry per API, each citing the documented behaviour.

Rules never list library names for these questions; they ask the queries at the bottom of this module:

- which methods of ``nn.Module`` return the module itself, without running it (``model.to(device).eval()``);
- which calls wrap or move a module and return it (DDP, ``torch.compile``, ``accelerator.prepare``), and which of
  their arguments is the module;
- which loaders return a model already in evaluation mode (``from_pretrained``, ``torch.jit.load``);
- which samplers shard data across processes;
- which calls write a checkpoint and which read one back;
- which libraries' training loops scale the loss, advance the sampler's epoch or switch train/eval themselves;
- which classes are optimizers, which calls iterate their argument (``enumerate``, ``tqdm``);
- which top-level packages are libraries, not this repository's code.
"""
from __future__ import annotations

import enum
import re
import sys
from dataclasses import dataclass
from typing import Optional

_TORCH_MODULE = "https://pytorch.org/docs/stable/generated/torch.nn.Module.html"


class Does(enum.Enum):
    """One thing an API does, as far as the rules' questions go."""

    RETURNS_SAME_MODULE = "returns the module it was called on (or given), without running it"
    WRAPS_MODULE = "returns a wrapper around the module it was given, without running it"
    MOVES_MODULE = "moves the module's parameters to a device"
    REPLICATES_PER_DEVICE = "runs a replica of the module on each GPU of one process (DataParallel)"
    REPLICATES_PER_PROCESS = "runs a replica of the module in each process, gradients all-reduced (DDP)"
    RETURNS_EVAL_MODEL = "returns a model already in evaluation mode"
    SHARDS_DATA = "gives each process its own part of the data"
    SAMPLES_PER_PROCESS = "a sampler of each process's part, reshuffled by set_epoch(epoch)"
    WRITES_TORCH_CHECKPOINT = "writes a file torch.load reads back"
    READS_TORCH_CHECKPOINT = "reads a file torch.save wrote (a pickle in a zip archive)"
    REPORTS_WRITTEN_CHECKPOINTS = ("a checkpoint callback (or a trainer holding one): its path attributes "
                                   "(WRITTEN_CHECKPOINT_ATTRIBUTES) name files the training run itself wrote")
    SCALES_LOSS = "its training loop scales the loss for mixed precision itself"
    ADVANCES_SAMPLER_EPOCH = "its training loop calls the distributed sampler's set_epoch itself"
    SETS_MODULE_MODE = "its training loop switches the model between train() and eval() itself"
    LOADS_BATCHES = "iterates a data set in batches (a data loader)"
    HOLDS_DATA_IN_MEMORY = "a data set of small tensors held in memory: nothing to decode or read per item"
    HOLDS_IMAGES_IN_MEMORY = ("a data set that reads its whole array of images when built: nothing to read or "
                              "decode per item, but each item is still an image to copy to the device")
    RETURNS_RANK = "returns the process's rank in the job, or whether it is the main process"
    SELECTS_PROCESS_DEVICE = "selects this process's device (its argument is the process's device index)"
    JOINS_PROCESS_GROUP = "joins the process group (its rank= argument is this process's rank)"
    SPAWNS_PROCESSES = "starts one process per rank, passing the process index as its function's first argument"
    RUNS_ON_RANK_ZERO = "a decorator: the function it wraps runs on the process of rank 0 only"
    TAKES_TENSOR_DICT = "takes a dict of tensors (a state dict), never a module, as its first argument"
    RETURNS_ITERATOR = "returns a Python 3 iterator (a generator): next(it) works, the Python 2 it.next() does not"
    KEEPS_FP32_MASTER_WEIGHTS = "trains a float16 model through a float32 master copy of its weights"
    CLIPS_GRADIENTS = "clips the gradients of the parameters it is given (or of the model it wraps) in place"
    SETS_DEFAULT_DEVICE = "sets the device factory functions (torch.zeros...) create tensors on without device="
    KEEPS_GPU_BUSY = ("compiles or captures the GPU work of a step so that the host only launches it (torch.compile, "
                      "CUDA graphs): a program that does this is built for throughput, and a host sync stalls it")
    # where a value comes from when it comes from outside the program (analyzers/program/origins.py)
    READS_COMMAND_LINE = "gives what the command line said (the arguments the program was started with)"
    READS_ENVIRONMENT = "gives what the process's environment variables say"
    READS_CONFIGURATION = "gives what a configuration file says (parsed YAML, JSON, TOML)"
    READS_USER_INPUT = "gives what the user types"
    DOWNLOADS = "fetches a file or its content from the network"
    RETURNS_ITS_ARGUMENT = "returns the tensor it is given (a deprecated wrapper that no longer wraps)"
    BUILDS_PATH = "returns a path or string built from its arguments (what they come from, it comes from)"
    FILLS_PARAMETERS_FROM_OUTSIDE = ("a decorator: the function it wraps is called with what the outside says (which "
                                     "outside: the READS_* it is tagged with)")


@dataclass(frozen=True)
class Api:
    does: frozenset  # of Does
    doc: str  # the page that documents the behaviour
    module_argument: Optional[tuple[int, str]] = None  # (position, keyword) of the module a wrapper is given


def _api(doc: str, *does: Does, module_argument: Optional[tuple[int, str]] = None) -> Api:
    return Api(frozenset(does), doc, module_argument)


# ``nn.Module`` methods that return ``self``: "Returns: self" in each method's documentation. ``type`` also
# returns self on a module but a type name (a str) on a tensor, so it is left out of chains through unknown
# receivers.
MODULE_METHODS: dict[str, Api] = {
    name: _api(f"{_TORCH_MODULE}#torch.nn.Module.{name}", Does.RETURNS_SAME_MODULE,
               *((Does.MOVES_MODULE,) if name in ("to", "cuda", "cpu", "xpu", "ipu", "mtia", "to_empty") else ()))
    for name in ("to", "cuda", "cpu", "xpu", "ipu", "mtia", "to_empty", "float", "double", "half", "bfloat16",
                 "train", "eval", "requires_grad_", "share_memory", "apply")
}

_DDP_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
_DP_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.DataParallel.html"
_FSDP_DOC = "https://pytorch.org/docs/stable/fsdp.html"
_HF_EVAL = ("https://huggingface.co/docs/transformers/main_classes/model#transformers.PreTrainedModel.from_pretrained"
            " (\"The model is set in evaluation mode by default using model.eval()\")")
_DIFFUSERS_EVAL = ("https://huggingface.co/docs/diffusers/api/models/overview#diffusers.ModelMixin.from_pretrained"
                   " (\"The model is set in evaluation mode - model.eval() - by default\")")
_SAMPLER_DOC = "https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler"
_SERIALIZATION = "https://pytorch.org/docs/stable/notes/serialization.html"

# Functions and classes, by qualified name (as :meth:`FileContext.qualified_name` resolves them).
APIS: dict[str, Api] = {
    # --- torch: wrappers that return a module around the one they are given
    "torch.compile": _api("https://pytorch.org/docs/stable/generated/torch.compile.html", Does.WRAPS_MODULE,
                          Does.KEEPS_GPU_BUSY, module_argument=(0, "model")),
    **{name: _api(_DP_DOC, Does.WRAPS_MODULE, Does.REPLICATES_PER_DEVICE, module_argument=(0, "module"))
       for name in ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                    "torch.nn.parallel.data_parallel.DataParallel")},
    **{name: _api(_DDP_DOC, Does.WRAPS_MODULE, Does.REPLICATES_PER_PROCESS, module_argument=(0, "module"))
       for name in ("torch.nn.parallel.DistributedDataParallel",
                    "torch.nn.parallel.distributed.DistributedDataParallel")},
    "torch.distributed.fsdp.FullyShardedDataParallel": _api(_FSDP_DOC, Does.WRAPS_MODULE, Does.MOVES_MODULE,
                                                            module_argument=(0, "module")),
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm": _api(
        "https://pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html"
        "#torch.nn.SyncBatchNorm.convert_sync_batchnorm", Does.RETURNS_SAME_MODULE, module_argument=(0, "module")),
    "torch.nn.utils.weight_norm": _api("https://pytorch.org/docs/stable/generated/torch.nn.utils.weight_norm.html",
                                       Does.RETURNS_SAME_MODULE, module_argument=(0, "module")),
    "torch.nn.utils.spectral_norm": _api(
        "https://pytorch.org/docs/stable/generated/torch.nn.utils.spectral_norm.html",
        Does.RETURNS_SAME_MODULE, module_argument=(0, "module")),
    "torch.nn.utils.parametrizations.weight_norm": _api(
        "https://pytorch.org/docs/stable/generated/torch.nn.utils.parametrizations.weight_norm.html",
        Does.RETURNS_SAME_MODULE, module_argument=(0, "module")),
    "torch.nn.utils.parametrizations.spectral_norm": _api(
        "https://pytorch.org/docs/stable/generated/torch.nn.utils.parametrizations.spectral_norm.html",
        Does.RETURNS_SAME_MODULE, module_argument=(0, "module")),
    # a copy of the module: same class, same layers (what "which class built it" asks)
    "copy.deepcopy": _api("https://docs.python.org/3/library/copy.html#copy.deepcopy", Does.RETURNS_SAME_MODULE,
                          module_argument=(0, "x")),
    # --- loaders of models in evaluation mode
    "torch.jit.load": _api("https://pytorch.org/docs/stable/generated/torch.jit.load.html"
                           " (a ScriptModule keeps the training flag it was saved with; models are exported in eval)",
                           Does.RETURNS_EVAL_MODEL),
    "torch.export.load": _api("https://pytorch.org/docs/stable/export.html#torch.export.load",
                              Does.RETURNS_EVAL_MODEL),
    # ESPnet's inference wrappers put their model in eval mode when built and decode under no_grad
    **{name: _api("https://espnet.github.io/espnet/_gen/espnet2.bin.html#espnet2-bin-asr-inference "
                  "(Speech2Text: \"asr_model.eval()\" in __init__, __call__ under torch.no_grad)",
                  Does.RETURNS_EVAL_MODEL)
       for name in ("espnet2.bin.asr_inference.Speech2Text", "espnet2.bin.tts_inference.Text2Speech")},
    # --- data sharding
    "torch.utils.data.DistributedSampler": _api(_SAMPLER_DOC, Does.SHARDS_DATA, Does.SAMPLES_PER_PROCESS),
    "torch.utils.data.distributed.DistributedSampler": _api(_SAMPLER_DOC, Does.SHARDS_DATA,
                                                            Does.SAMPLES_PER_PROCESS),
    "datasets.distributed.split_dataset_by_node": _api(
        "https://huggingface.co/docs/datasets/package_reference/main_classes"
        "#datasets.distributed.split_dataset_by_node", Does.SHARDS_DATA),
    # --- what save / load read and write
    **{name: _api(f"{_SERIALIZATION}#saving-and-loading-tensors", Does.WRITES_TORCH_CHECKPOINT)
       for name in ("torch.save", "torch.serialization.save")},
    **{name: _api("https://pytorch.org/docs/stable/generated/torch.load.html", Does.READS_TORCH_CHECKPOINT)
       for name in ("torch.load", "torch.serialization.load")},
    # --- "The Variable API has been deprecated ... Variable(tensor) and Variable(tensor, requires_grad) still work as
    # expected, but they return Tensors instead of Variables" (https://pytorch.org/docs/stable/autograd.html#variable-deprecated)
    **{name: _api("https://pytorch.org/docs/stable/autograd.html#variable-deprecated", Does.RETURNS_ITS_ARGUMENT)
       for name in ("torch.autograd.Variable", "torch.autograd.variable.Variable", "torch.Variable")},
    # --- values that come from outside the program: what a path built from one points at is chosen by whoever runs
    # it (https://docs.python.org/3/library/sys.html#sys.argv, .../os.html#os.environ, .../os.html#os.getenv,
    # .../functions.html#input, https://abseil.io/docs/python/guides/flags)
    **{name: _api("https://docs.python.org/3/library/sys.html#sys.argv", Does.READS_COMMAND_LINE)
       for name in ("sys.argv", "absl.flags.FLAGS")},
    **{name: _api("https://docs.python.org/3/library/os.html#os.environ", Does.READS_ENVIRONMENT)
       for name in ("os.environ", "os.getenv", "os.environ.get", "os.getenvb")},
    **{name: _api("https://docs.python.org/3/library/functions.html#input", Does.READS_USER_INPUT)
       for name in ("input", "builtins.input")},
    # parsers of configuration files: https://pyyaml.org/wiki/PyYAMLDocumentation, json.load, tomllib.load,
    # https://omegaconf.readthedocs.io/en/latest/usage.html#from-a-yaml-file (OmegaConf.load; from_cli reads argv)
    **{name: _api("https://pyyaml.org/wiki/PyYAMLDocumentation; https://docs.python.org/3/library/json.html; "
                  "https://docs.python.org/3/library/tomllib.html; https://omegaconf.readthedocs.io/en/latest/usage.html",
                  Does.READS_CONFIGURATION)
       for name in ("yaml.load", "yaml.safe_load", "yaml.full_load", "yaml.unsafe_load", "json.load", "tomllib.load",
                    "toml.load", "omegaconf.OmegaConf.load", "mmcv.Config.fromfile", "mmengine.Config.fromfile",
                    "mmengine.config.Config.fromfile")},
    # path builders: https://docs.python.org/3/library/os.path.html, https://docs.python.org/3/library/pathlib.html
    **{name: _api("https://docs.python.org/3/library/os.path.html; https://docs.python.org/3/library/pathlib.html",
                  Does.BUILDS_PATH)
       for name in ("os.path.join", "os.path.expanduser", "os.path.expandvars", "os.path.abspath", "os.path.realpath",
                    "os.path.normpath", "os.fspath", "pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath")},
    # Hydra composes the decorated task function's config from YAML files and command-line overrides
    # (https://hydra.cc/docs/tutorials/basic/your_first_app/simple_cli/); click passes its options and arguments
    # (https://click.palletsprojects.com/en/stable/options/)
    "hydra.main": _api("https://hydra.cc/docs/tutorials/basic/your_first_app/simple_cli/",
                       Does.FILLS_PARAMETERS_FROM_OUTSIDE, Does.READS_CONFIGURATION),
    **{name: _api("https://click.palletsprojects.com/en/stable/options/", Does.FILLS_PARAMETERS_FROM_OUTSIDE,
                  Does.READS_COMMAND_LINE)
       for name in ("click.command", "click.option", "click.argument")},
    "omegaconf.OmegaConf.from_cli": _api("https://omegaconf.readthedocs.io/en/latest/usage.html#from-command-line-arguments",
                                         Does.READS_COMMAND_LINE),
    # downloads: each returns the fetched file's local path or its content
    **{name: _api("https://docs.python.org/3/library/urllib.request.html#urllib.request.urlretrieve; "
                  "https://huggingface.co/docs/huggingface_hub/package_reference/file_download; "
                  "https://requests.readthedocs.io/en/latest/api/#requests.get; https://github.com/wkentaro/gdown",
                  Does.DOWNLOADS)
       for name in ("urllib.request.urlretrieve", "urllib.request.urlopen", "huggingface_hub.hf_hub_download",
                    "huggingface_hub.snapshot_download", "huggingface_hub.cached_download", "requests.get",
                    "gdown.download", "gdown.cached_download", "wget.download", "torch.hub.download_url_to_file",
                    "fsspec.open")},
    # --- Lightning's checkpoint callback saves during ``trainer.fit``; ``best_model_path`` and its siblings name the
    # files it wrote; ``Trainer.checkpoint_callback`` is "the first ModelCheckpoint callback in the Trainer.callbacks
    # list"
    **{name: _api("https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.ModelCheckpoint.html "
                  "(best_model_path: \"the path to the best model checkpoint\"; last_model_path)",
                  Does.REPORTS_WRITTEN_CHECKPOINTS)
       for name in ("lightning.pytorch.callbacks.ModelCheckpoint",
                    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
                    "pytorch_lightning.callbacks.ModelCheckpoint",
                    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint")},
    **{name: _api("https://lightning.ai/docs/pytorch/stable/common/trainer.html#checkpoint-callback",
                  Does.REPORTS_WRITTEN_CHECKPOINTS)
       for name in ("lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.trainer.Trainer",
                    "pytorch_lightning.Trainer", "pytorch_lightning.trainer.trainer.Trainer")},
    # --- data loaders and in-memory data sets
    **{name: _api("https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader", Does.LOADS_BATCHES)
       for name in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")},
    "torch.utils.data.TensorDataset": _api("https://pytorch.org/docs/stable/data.html#torch.utils.data.TensorDataset"
                                           " (wraps tensors already in memory)", Does.HOLDS_DATA_IN_MEMORY),
    # torchvision's MNIST family loads the whole (70k x 28 x 28) set into one tensor when built
    **{f"torchvision.datasets.{name}": _api(f"https://pytorch.org/vision/stable/generated/torchvision.datasets"
                                            f".{name}.html", Does.HOLDS_DATA_IN_MEMORY)
       for name in ("MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST")},
    # the CIFAR family, SVHN and USPS read their whole set into one uint8 array when built;
    # ``__getitem__`` indexes it and wraps the item as an image: nothing to read or decode per item
    **{f"torchvision.datasets.{name}": _api(f"https://pytorch.org/vision/stable/generated/torchvision.datasets"
                                            f".{name}.html", Does.HOLDS_IMAGES_IN_MEMORY)
       for name in ("CIFAR10", "CIFAR100", "SVHN", "USPS")},
    # a tensor is itself a map-style data set (``__getitem__`` indexes its first dimension) held in memory
    **{f"torch.{name}": _api("https://pytorch.org/docs/stable/data.html#map-style-datasets (a tensor built in "
                             "memory, indexed by its first dimension)", Does.HOLDS_DATA_IN_MEMORY)
       for name in ("tensor", "as_tensor", "from_numpy", "stack", "cat", "LongTensor", "FloatTensor")},
    # --- safetensors writes a flat dict of tensors ("tensors (Dict[str, torch.Tensor])")
    **{name: _api("https://huggingface.co/docs/safetensors/api/torch#safetensors.torch.save_file",
                  Does.TAKES_TENSOR_DICT)
       for name in ("safetensors.torch.save_file", "safetensors.torch.save")},
    # --- ranks: where a process learns which one it is
    **{name: _api("https://pytorch.org/docs/stable/distributed.html#torch.distributed.get_rank", Does.RETURNS_RANK)
       for name in ("torch.distributed.get_rank", "torch.distributed.get_node_local_rank",
                    "torch.distributed.distributed_c10d.get_rank")},
    "torch_xla.core.xla_model.get_ordinal": _api("https://pytorch.org/xla/release/2.0/index.html"
                                                 "#torch_xla.core.xla_model.get_ordinal", Does.RETURNS_RANK),
    **{f"horovod.torch.{name}": _api("https://horovod.readthedocs.io/en/stable/api.html", Does.RETURNS_RANK)
       for name in ("rank", "local_rank")},
    "torch.cuda.set_device": _api("https://pytorch.org/docs/stable/generated/torch.cuda.set_device.html",
                                  Does.SELECTS_PROCESS_DEVICE),
    "torch.distributed.init_process_group": _api(
        "https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
        Does.JOINS_PROCESS_GROUP),
    **{name: _api("https://pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses"
                  " (\"fn ... called as fn(i, *args), where i is the process index\")", Does.SPAWNS_PROCESSES)
       for name in ("torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn",
                    "torch.multiprocessing.start_processes")},
    **{name: _api("https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.utilities.rank_zero.html",
                  Does.RUNS_ON_RANK_ZERO)
       for name in ("lightning.pytorch.utilities.rank_zero_only", "lightning.pytorch.utilities.rank_zero.rank_zero_only",
                    "pytorch_lightning.utilities.rank_zero_only",
                    "pytorch_lightning.utilities.rank_zero.rank_zero_only",
                    "lightning_utilities.core.rank_zero.rank_zero_only")},
    # --- optimizers and engines that train a half-precision model on a float32 master copy of its weights
    **{name: _api("https://nvidia.github.io/apex/fp16_utils.html#apex.fp16_utils.FP16_Optimizer (\"maintains fp32 "
                  "master parameters\" for a model cast to half)", Does.KEEPS_FP32_MASTER_WEIGHTS)
       for name in ("apex.fp16_utils.FP16_Optimizer", "apex.fp16_utils.fp16_optimizer.FP16_Optimizer",
                    "apex.optimizers.FP16_Optimizer")},
    "deepspeed.initialize": _api("https://www.deepspeed.ai/docs/config-json/#fp16-training-options (fp16 mode keeps "
                                 "fp32 master weights in its optimizer)", Does.KEEPS_FP32_MASTER_WEIGHTS),
    # --- accelerate: "Prepare all objects passed in args for distributed training and mixed precision": models
    # are wrapped (DDP/FSDP) and moved to the process's device, data loaders sharded across processes
    **{f"{cls}.prepare": _api("https://huggingface.co/docs/accelerate/package_reference/accelerator"
                              "#accelerate.Accelerator.prepare", Does.MOVES_MODULE, Does.SHARDS_DATA)
       for cls in ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")},
}

# What a checkpoint callback (ModelCheckpoint) reports of the files it wrote, and the trainer attribute that holds
# the callback (https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.ModelCheckpoint.html).
WRITTEN_CHECKPOINT_ATTRIBUTES = frozenset({"best_model_path", "last_model_path", "kth_best_model_path"})
CHECKPOINT_CALLBACK_ATTRIBUTES = frozenset({"checkpoint_callback"})

# Methods known by name on receivers the rules cannot resolve (``AutoModel.from_pretrained``): what the method
# does on the libraries that define it.
METHODS: dict[str, Api] = {
    # transformers' and diffusers' pretrained models come back in evaluation mode
    "from_pretrained": _api(f"{_HF_EVAL}; {_DIFFUSERS_EVAL}", Does.RETURNS_EVAL_MODEL),
    # str.format and pathlib's joins build a path from the receiver and their arguments
    # (https://docs.python.org/3/library/stdtypes.html#str.format, .../pathlib.html#pathlib.PurePath.joinpath)
    **{name: _api("https://docs.python.org/3/library/stdtypes.html#str.format; "
                  "https://docs.python.org/3/library/pathlib.html#pathlib.PurePath.joinpath", Does.BUILDS_PATH)
       for name in ("format", "joinpath", "with_name", "with_suffix")},
    # command-line parsers: argparse's ArgumentParser.parse_args / parse_known_args
    # (https://docs.python.org/3/library/argparse.html#the-parse-args-method), and transformers' HfArgumentParser
    # (https://huggingface.co/docs/transformers/internal/trainer_utils#transformers.HfArgumentParser), whose
    # parse_*_file methods read a configuration file
    **{name: _api("https://docs.python.org/3/library/argparse.html#the-parse-args-method; "
                  "https://huggingface.co/docs/transformers/internal/trainer_utils#transformers.HfArgumentParser",
                  Does.READS_COMMAND_LINE)
       for name in ("parse_args", "parse_known_args", "parse_args_into_dataclasses")},
    **{name: _api("https://huggingface.co/docs/transformers/internal/trainer_utils#transformers.HfArgumentParser",
                  Does.READS_CONFIGURATION)
       for name in ("parse_json_file", "parse_yaml_file")},
    # nn.Module's traversals are generators ("Yields:" in each method's documentation)
    **{name: _api(f"{_TORCH_MODULE}#torch.nn.Module.{name}", Does.RETURNS_ITERATOR)
       for name in ("parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
                    "modules", "named_modules")},
}

# ... except on the classes whose ``from_pretrained`` gives no module: transformers' tokenizers
# (PreTrainedTokenizerBase), configurations (PretrainedConfig), processors and feature extractors (ProcessorMixin,
# FeatureExtractionMixin, ImageProcessingMixin), and diffusers' schedulers (SchedulerMixin), by the suffix those
# families' class names share (``AutoTokenizer``, ``BertTokenizerFast``, ``AutoConfig``, ``DDPMScheduler``)
PRETRAINED_NOT_MODULES: dict[str, str] = {
    **{suffix: "https://huggingface.co/docs/transformers/main_classes/tokenizer"
       for suffix in ("Tokenizer", "TokenizerFast")},
    "Config": "https://huggingface.co/docs/transformers/main_classes/configuration",
    "Processor": "https://huggingface.co/docs/transformers/main_classes/processors",
    "FeatureExtractor": "https://huggingface.co/docs/transformers/main_classes/feature_extractor",
    "Scheduler": "https://huggingface.co/docs/diffusers/api/schedulers/overview",
}


def pretrained_gives_no_module(receiver: Optional[str]) -> bool:
    """``receiver.from_pretrained(...)`` returns a tokenizer, a configuration, a processor or a scheduler."""
    return bool(receiver) and receiver.rsplit(".", 1)[-1].endswith(tuple(PRETRAINED_NOT_MODULES))


_LIGHTNING = ("https://lightning.ai/docs/pytorch/stable/common/trainer.html (precision=\"16-mixed\" scales the "
              "loss; use_distributed_sampler adds a DistributedSampler and sets its epoch; validation runs in eval "
              "mode)")
_ACCELERATE = ("https://huggingface.co/docs/accelerate/package_reference/accelerator (accelerator.backward scales the "
               "loss under mixed precision; prepared data loaders are sharded across processes and set their "
               "sampler's epoch)")
_SCALES = "the library's mixed-precision training wraps backward in its own loss scaler: "
# Libraries whose own training loop does a duty the rules otherwise ask of the user's loop, by top-level package.
TRAINING_LIBRARIES: dict[str, Api] = {
    "lightning": _api(_LIGHTNING, Does.SCALES_LOSS, Does.ADVANCES_SAMPLER_EPOCH, Does.SETS_MODULE_MODE,
                      Does.SHARDS_DATA),
    "pytorch_lightning": _api(_LIGHTNING, Does.SCALES_LOSS, Does.ADVANCES_SAMPLER_EPOCH, Does.SETS_MODULE_MODE,
                              Does.SHARDS_DATA),
    "accelerate": _api(_ACCELERATE, Does.SCALES_LOSS, Does.ADVANCES_SAMPLER_EPOCH, Does.SHARDS_DATA),
    "deepspeed": _api(_SCALES + "https://www.deepspeed.ai/docs/config-json/#fp16-training-options", Does.SCALES_LOSS),
    "apex": _api(_SCALES + "https://nvidia.github.io/apex/amp.html", Does.SCALES_LOSS),
    "fairscale": _api(_SCALES + "https://fairscale.readthedocs.io/en/latest/api/optim/grad_scaler.html",
                      Does.SCALES_LOSS),
    "transformers": _api(_SCALES + "https://huggingface.co/docs/transformers/main_classes/trainer "
                         "(TrainingArguments fp16/bf16)", Does.SCALES_LOSS),
    "composer": _api(_SCALES + "https://docs.mosaicml.com/projects/composer/en/stable/", Does.SCALES_LOSS),
    "colossalai": _api(_SCALES + "https://colossalai.org/docs/features/mixed_precision_training_with_booster",
                       Does.SCALES_LOSS),
}

# Attributes that hold the process's rank or whether it is the main process, on the objects the libraries give
# (accelerate's Accelerator and PartialState, Lightning's Trainer / LightningModule / Fabric, transformers' Trainer
# and TrainingArguments): https://huggingface.co/docs/accelerate/package_reference/state,
# https://lightning.ai/docs/pytorch/stable/common/trainer.html#properties,
# https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
RANK_ATTRIBUTES = frozenset({"process_index", "local_process_index", "is_main_process", "is_local_main_process",
                             "global_rank", "local_rank", "node_rank", "is_global_zero", "is_world_process_zero",
                             "is_local_process_zero", "process_rank"})
# Environment variables the launchers (torchrun, torch.distributed.launch, SLURM, MPI) set to the rank:
# https://pytorch.org/docs/stable/elastic/run.html#environment-variables
RANK_ENVIRONMENT = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID",
                              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"})
# The predicates the libraries above name "is this the main process", as projects' own helpers copy them
RANK_PREDICATE_NAMES = frozenset({"is_main_process", "is_local_main_process", "is_global_zero", "is_world_process_zero",
                                  "is_local_process_zero", "is_master", "is_main", "is_master_process",
                                  "master_process", "main_process", "is_primary", "is_rank_zero", "is_rank_0"})

# Optimizer classes by name, for calls the rules cannot resolve (``from timm.optim import Lamb``, a project's
# copy of ``Lion``): torch.optim's algorithms and the widely used third-party ones.
OPTIMIZER_CLASSES: dict[str, str] = {
    **{name: "https://pytorch.org/docs/stable/optim.html#algorithms"
       for name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "LBFGS",
                    "SparseAdam", "ASGD", "Rprop")},
    "Lion": "https://huggingface.co/docs/timm/reference/optimizers",
    "LAMB": "https://nvidia.github.io/apex/optimizers.html#apex.optimizers.FusedLAMB",
    "Lamb": "https://huggingface.co/docs/timm/reference/optimizers",
    "LARS": "https://huggingface.co/docs/timm/reference/optimizers",
    "Adafactor": "https://huggingface.co/docs/transformers/main_classes/optimizer_schedules#transformers.Adafactor",
    **{name: "https://huggingface.co/docs/bitsandbytes/main/en/reference/optim/adam"
       for name in ("Adam8bit", "AdamW8bit", "PagedAdamW8bit", "PagedAdamW")},
}

# Calls that yield the items of their first argument, by last name: ``for i, (x, y) in enumerate(tqdm(loader))``
# iterates ``loader``.
ITERATION_WRAPPERS: dict[str, str] = {
    "enumerate": "https://docs.python.org/3/library/functions.html#enumerate",
    "iter": "https://docs.python.org/3/library/functions.html#iter",
    "zip": "https://docs.python.org/3/library/functions.html#zip",
    "tqdm": "https://tqdm.github.io/docs/tqdm/",
    "trange": "https://tqdm.github.io/docs/shortcuts/#trange",
    "track": "https://rich.readthedocs.io/en/stable/reference/progress.html#rich.progress.track",
    "progress_bar": "https://docs.fast.ai/callback.progress.html",
}

# Top-level packages that are libraries: a class built from one of them is not this repository's model class.
ML_LIBRARY_ROOTS = frozenset({"torch", "torchvision", "torchaudio", "torchtext", "transformers", "timm", "lightning",
                              "pytorch_lightning", "numpy", "sklearn", "tensorflow", "jax", "flax", "diffusers",
                              "accelerate", "peft"})
LIBRARY_ROOTS = ML_LIBRARY_ROOTS | frozenset(sys.stdlib_module_names)


# ---- scikit-learn and the libraries that follow its estimator API ---------------------------------------------
_SKLEARN_GUIDE = "https://scikit-learn.org/stable/"
# Packages of transformers that learn statistics of the rows they are fit on: ``fit`` then ``transform``
# (https://scikit-learn.org/stable/data_transforms.html; ``sklearn.experimental`` enables IterativeImputer).
FITTED_TRANSFORMER_PACKAGES = ("sklearn.preprocessing.", "sklearn.feature_extraction.", "sklearn.decomposition.",
                               "sklearn.impute.", "sklearn.feature_selection.", "sklearn.experimental.")
# Of those, the ones whose ``fit`` learns nothing from the rows: each class's docs call it stateless ("This estimator
# is stateless and does not need to be fitted", e.g. https://scikit-learn.org/stable/modules/generated/
# sklearn.preprocessing.Normalizer.html), so fitting them on test data is harmless.
STATELESS_TRANSFORMERS = frozenset({"FunctionTransformer", "Binarizer", "Normalizer", "PolynomialFeatures",
                                    "HashingVectorizer", "FeatureHasher"})
# Encoders of target labels: fit on every label they only fix the list of classes
# (https://scikit-learn.org/stable/modules/preprocessing_targets.html).
LABEL_ENCODERS = frozenset({"LabelEncoder", "LabelBinarizer", "MultiLabelBinarizer"})
# Chains and unions of steps, fit as one (https://scikit-learn.org/stable/modules/compose.html).
PIPELINES = frozenset({"sklearn.pipeline.Pipeline", "sklearn.pipeline.make_pipeline", "sklearn.pipeline.FeatureUnion",
                       "sklearn.pipeline.make_union"})
COLUMN_TRANSFORMERS = frozenset({"sklearn.compose.ColumnTransformer", "sklearn.compose.make_column_transformer",
                                 "sklearn.compose._column_transformer.ColumnTransformer"})
# Functions that split arrays into train and test rows, and that fit and score on folds of their ``X``
# (https://scikit-learn.org/stable/modules/cross_validation.html; ``sklearn.cross_validation`` before 0.20).
TRAIN_TEST_SPLITTERS = frozenset({"sklearn.model_selection.train_test_split",
                                  "sklearn.cross_validation.train_test_split"})
CROSS_VALIDATION_FUNCTIONS = frozenset({"sklearn.model_selection.cross_val_score",
                                        "sklearn.model_selection.cross_validate",
                                        "sklearn.model_selection.cross_val_predict"})
MODEL_SELECTION_PACKAGE = "sklearn.model_selection."  # its classes' ``split(X)`` yields train/test indices
# Packages whose classes are estimators with ``fit(X, y)`` (scikit-learn's API, which XGBoost, LightGBM and
# CatBoost follow: https://xgboost.readthedocs.io/en/stable/python/sklearn_estimator.html); of scikit-learn's,
# the meta-estimators that search, chain or split rather than learn a model of their own.
ESTIMATOR_PACKAGES = ("sklearn.", "xgboost.", "lightgbm.", "catboost.")
META_ESTIMATOR_PACKAGES = ("sklearn.model_selection.", "sklearn.pipeline.", "sklearn.compose.")
METRICS_PACKAGE = "sklearn.metrics."  # functions that score predictions against labels
# Functions that stack the rows of their arguments into one array or frame.
ROW_CONCATENATIONS = frozenset({"pandas.concat", "numpy.concatenate", "numpy.vstack", "numpy.row_stack", "torch.cat",
                                "torch.vstack"})


def fitted_transformer(qualified: Optional[str]) -> Optional[str]:
    """The class name when ``qualified`` is a transformer whose ``fit`` learns from the rows it is given."""
    if qualified is None or not qualified.startswith(FITTED_TRANSFORMER_PACKAGES):
        return None
    last = qualified.rsplit(".", 1)[-1]
    return last if last[:1].isupper() and last not in STATELESS_TRANSFORMERS else None


def learns_from_rows(qualified: Optional[str]) -> bool:
    """A transformer of the packages that fit on rows (stateless ones included): not a model of its own."""
    return qualified is not None and qualified.startswith(FITTED_TRANSFORMER_PACKAGES)


def is_estimator_class(qualified: Optional[str]) -> bool:
    """A class of an estimator library (a model or meta-estimator with ``fit``), not one of its functions."""
    return qualified is not None and qualified.startswith(ESTIMATOR_PACKAGES) and \
        qualified.rsplit(".", 1)[-1][:1].isupper()


def is_meta_estimator(qualified: Optional[str]) -> bool:
    return qualified is not None and qualified.startswith(META_ESTIMATOR_PACKAGES)


def is_metric(qualified: Optional[str]) -> bool:
    return qualified is not None and qualified.startswith(METRICS_PACKAGE)


def is_model_selection(qualified: Optional[str]) -> bool:
    return qualified is not None and qualified.startswith(MODEL_SELECTION_PACKAGE)


# ---- queries ------------------------------------------------------------------------------------

def method_returns_same_module(method: str) -> bool:
    """``model.<method>(...)`` returns ``model`` itself (``.to(device)``, ``.eval()``, ``.half()``)."""
    return method in MODULE_METHODS


def wrapped_module_argument(qualified: Optional[str]) -> Optional[tuple[int, str]]:
    """(position, keyword) of the module ``qualified(...)`` wraps or returns; None when it is no such call."""
    api = APIS.get(qualified) if qualified else None
    if api is None or not api.does & {Does.WRAPS_MODULE, Does.RETURNS_SAME_MODULE}:
        return None
    return api.module_argument


# --- half precision. torch's 16-bit floating dtypes (https://pytorch.org/docs/stable/tensor_attributes.html#torch.dtype)
# and its autocast regions, which run eligible ops in float16 or bfloat16 (https://pytorch.org/docs/stable/amp.html);
# the libraries' options that do the same: transformers' ``torch_dtype``
# (https://huggingface.co/docs/transformers/main_classes/model#large-model-loading), accelerate's
# ``mixed_precision`` (https://huggingface.co/docs/accelerate/package_reference/accelerator), Lightning's
# ``precision`` (https://lightning.ai/docs/pytorch/stable/common/precision_basic.html).
HALF_PRECISION_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})
AUTOCAST_APIS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})
HALF_PRECISION_METHODS = frozenset({"half", "bfloat16"})
PRECISION_OPTIONS = frozenset({"dtype", "torch_dtype", "mixed_precision", "precision"})
HALF_PRECISION_SETTINGS = frozenset({"float16", "bfloat16", "fp16", "bf16", "half", "16", "16-mixed", "bf16-mixed",
                                     "16-true", "bf16-true"})

# --- work that runs asynchronously of the host: CUDA streams and events
# (https://pytorch.org/docs/stable/notes/cuda.html#cuda-streams, https://pytorch.org/docs/stable/generated/
# torch.cuda.Event.html), and the tensor methods that order work across streams (Tensor.record_stream,
# https://pytorch.org/docs/stable/generated/torch.Tensor.record_stream.html; Stream.wait_stream / wait_event).
STREAM_APIS = frozenset({"torch.cuda.Stream", "torch.cuda.Event", "torch.cuda.stream", "torch.cuda.ExternalStream",
                         "torch.Stream", "torch.Event", "torch.cuda.current_stream", "torch.cuda.default_stream"})
STREAM_METHODS = frozenset({"record_stream", "wait_stream", "wait_event", "record_event"})

# --- the default device: "Sets the default torch.Tensor to be allocated on device. ... factory calls will be
# performed as if they were passed device as an argument" (https://pytorch.org/docs/stable/generated/
# torch.set_default_device.html)
APIS["torch.set_default_device"] = _api("https://pytorch.org/docs/stable/generated/torch.set_default_device.html",
                                        Does.SETS_DEFAULT_DEVICE)

# --- CUDA graphs: "CUDA Graphs ... reduce CPU overhead": the captured work is replayed by one launch
# (https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs, .../generated/torch.cuda.graph.html,
# .../generated/torch.cuda.CUDAGraph.html, .../generated/torch.cuda.make_graphed_callables.html)
APIS.update({name: _api("https://pytorch.org/docs/stable/notes/cuda.html#cuda-graphs", Does.KEEPS_GPU_BUSY)
             for name in ("torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables")})

# --- gradient clipping. torch's functions clip "the gradient norm of an iterable of parameters ... in-place"
# (https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html, .../clip_grad_value_.html,
# .../clip_grads_with_norm_.html); timm's dispatch_clip_grad calls them
# (https://huggingface.co/docs/timm/reference/utils#timm.utils.dispatch_clip_grad).
_CLIP_DOC = "https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html"
CLIPPING_APIS: frozenset = frozenset(
    f"{package}.{name}" for package in ("torch.nn.utils", "torch.nn.utils.clip_grad")
    for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value", "clip_grads_with_norm_")
) | frozenset({"timm.utils.dispatch_clip_grad", "timm.utils.clip_grad.dispatch_clip_grad"})
APIS.update({name: _api(_CLIP_DOC, Does.CLIPS_GRADIENTS) for name in CLIPPING_APIS})
# ... and the methods of the libraries that clip a model's gradients for it, known by name on receivers the rules
# cannot resolve: accelerate's Accelerator.clip_grad_norm_ / clip_grad_value_
# (https://huggingface.co/docs/accelerate/package_reference/accelerator#accelerate.Accelerator.clip_grad_norm_),
# FSDP's FullyShardedDataParallel.clip_grad_norm_ (https://pytorch.org/docs/stable/fsdp.html), Lightning's
# Fabric.clip_gradients and LightningModule.clip_gradients
# (https://lightning.ai/docs/fabric/stable/api/fabric_methods.html#clip-gradients,
# https://lightning.ai/docs/pytorch/stable/common/lightning_module.html#clip-gradients), fairseq's
# FairseqOptimizer.clip_grad_norm (https://fairseq.readthedocs.io/en/latest/optim.html)
METHODS.update({name: _api("https://huggingface.co/docs/accelerate/package_reference/accelerator; "
                           "https://pytorch.org/docs/stable/fsdp.html; "
                           "https://lightning.ai/docs/fabric/stable/api/fabric_methods.html#clip-gradients; "
                           "https://fairseq.readthedocs.io/en/latest/optim.html", Does.CLIPS_GRADIENTS)
                for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients")})
# The options that make a library's own training step clip: Lightning's Trainer(gradient_clip_val=...)
# (https://lightning.ai/docs/pytorch/stable/common/trainer.html#gradient-clip-val), transformers'
# TrainingArguments(max_grad_norm=1.0 by default) (https://huggingface.co/docs/transformers/main_classes/trainer
# #transformers.TrainingArguments.max_grad_norm), a DeepSpeed configuration's "gradient_clipping"
# (https://www.deepspeed.ai/docs/config-json/#gradient-clipping), MMEngine's optim_wrapper clip_grad
# (https://mmengine.readthedocs.io/en/latest/tutorials/optim_wrapper.html#gradient-clipping). They clip the steps the
# library takes (the trainer's loop, the engine's step), never a torch optimizer's own step() in the user's loop.
CLIPPING_OPTIONS: dict[str, str] = {
    "gradient_clip_val": "https://lightning.ai/docs/pytorch/stable/common/trainer.html#gradient-clip-val",
    "max_grad_norm": "https://huggingface.co/docs/transformers/main_classes/trainer",
    "gradient_clipping": "https://www.deepspeed.ai/docs/config-json/#gradient-clipping",
    "clip_grad": "https://mmengine.readthedocs.io/en/latest/tutorials/optim_wrapper.html#gradient-clipping",
}


# the last names of the calls :func:`wrapped_module_argument` knows: a cheap test before resolving a callee
WRAPPER_LAST_NAMES = frozenset(name.rsplit(".", 1)[-1] for name, api in APIS.items()
                               if api.module_argument is not None)


def does(qualified: Optional[str], what: Does) -> bool:
    api = APIS.get(qualified) if qualified else None
    return api is not None and what in api.does


def method_does(method: Optional[str], what: Does) -> bool:
    api = METHODS.get(method) if method else None
    return api is not None and what in api.does


def apis_that(what: Does) -> frozenset:
    """Qualified names of the functions and classes that do ``what``."""
    return frozenset(name for name, api in APIS.items() if what in api.does)


# Iterable-style data sets: "each worker / process ... the dataset itself decides what it yields" (an IterableDataset
# is never given a sampler: https://pytorch.org/docs/stable/data.html#iterable-style-datasets); webdataset's
# WebDataset is one (https://github.com/webdataset/webdataset#readme, nodesplitter= splits its shards across nodes).
ITERABLE_DATASETS = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset",
                               "torch.utils.data.IterDataPipe", "webdataset.WebDataset", "webdataset.DataPipeline"})


def training_libraries_that(what: Does) -> tuple[str, ...]:
    """Top-level packages whose training loop does ``what`` for the user (a file importing one leaves it to them)."""
    return tuple(root for root, api in TRAINING_LIBRARIES.items() if what in api.does)


# the last names of the calls that train a half model on float32 master weights: a cheap test before resolving
# --- what ``model.eval()`` changes among torch.nn's layers. Module.eval "has an effect only on certain modules"
# (https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval): dropout, which "during
# training ... randomly zeroes some of the elements" and is the identity in evaluation
# (https://pytorch.org/docs/stable/generated/torch.nn.Dropout.html), and batch norm, which normalizes with the batch's
# statistics in training and with its running estimates in evaluation, unless built with track_running_stats=False
# (https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html). InstanceNorm "uses instance statistics in both
# training and evaluation modes" unless built with track_running_stats=True
# (https://pytorch.org/docs/stable/generated/torch.nn.InstanceNorm2d.html). Every other torch.nn layer computes the same
# thing in both modes (recurrent layers apply their ``dropout=`` argument in training only).
MODE_DEPENDENT_LAYERS = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                                   "FeatureAlphaDropout"})
# batch norm: mode-dependent by default, not with track_running_stats=False
NORM_LAYERS_WITH_STATS = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
                                    "LazyBatchNorm2d", "LazyBatchNorm3d"})
# batch norm with its statistics fixed by construction: torchvision's FrozenBatchNorm2d ("BatchNorm2d where the batch
# statistics and the affine parameters are fixed", https://pytorch.org/vision/stable/generated/
# torchvision.ops.FrozenBatchNorm2d.html), and the copies detectron2 and timm keep
# (https://detectron2.readthedocs.io/en/latest/modules/layers.html#detectron2.layers.FrozenBatchNorm2d,
# https://huggingface.co/docs/timm/reference/layers); OpenMMLab backbones' ``norm_eval=True`` "set norm layers to eval
# mode, namely, freeze running stats" (https://mmdetection.readthedocs.io/en/latest/api.html#mmdet.models.backbones.
# ResNet), and BatchNorm's own ``track_running_stats=False`` / ``momentum=0`` keep no running statistics to change.
FROZEN_NORM_LAYERS = frozenset({"torchvision.ops.FrozenBatchNorm2d", "torchvision.ops.misc.FrozenBatchNorm2d",
                                "detectron2.layers.FrozenBatchNorm2d", "timm.layers.FrozenBatchNorm2d",
                                "timm.models.layers.FrozenBatchNorm2d"})
NORM_FREEZING_OPTIONS = frozenset({"norm_eval"})
# instance norm: mode-dependent only with track_running_stats=True
NORM_LAYERS_STATS_OPTIONAL = frozenset({"InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LazyInstanceNorm1d",
                                        "LazyInstanceNorm2d", "LazyInstanceNorm3d"})

# Library models that hold no dropout, no batch norm and no code reading ``self.training``, so ``eval()`` changes
# nothing in them: PyTorch Geometric's shallow embedding models, one ``nn.Embedding`` table each
# (https://pytorch-geometric.readthedocs.io/en/latest/generated/torch_geometric.nn.models.Node2Vec.html,
# https://pytorch-geometric.readthedocs.io/en/latest/generated/torch_geometric.nn.models.MetaPath2Vec.html).
MODE_FREE_LIBRARY_MODELS = frozenset({"torch_geometric.nn.Node2Vec", "torch_geometric.nn.models.Node2Vec",
                                      "torch_geometric.nn.MetaPath2Vec", "torch_geometric.nn.models.MetaPath2Vec"})

# Model builders that name the architecture they build: ``torchvision.models.<architecture>(...)`` (every builder of
# https://pytorch.org/vision/stable/models.html) and ``timm.create_model("<architecture>", ...)``
# (https://huggingface.co/docs/timm/reference/models#timm.create_model). Of those, the architectures whose published
# definitions put BatchNorm layers in their body (ResNet, DenseNet, EfficientNet, MobileNet, VGG-BN, Inception, ...);
# torchvision's detection models use FrozenBatchNorm2d instead (https://pytorch.org/vision/stable/models.html#object-
# detection-instance-segmentation-and-person-keypoint-detection), so they are left out.
NAMED_ARCHITECTURE_BUILDERS = frozenset({"timm.create_model", "timm.models.create_model"})
_BATCHNORM_ARCHITECTURES = re.compile(
    r"resnet|resnext|densenet|efficientnet|mobilenet|mnasnet|shufflenet|regnet|inception|googlenet|vgg\d+_bn|darknet|"
    r"cspdark|hrnet|dla\d|res2net|senet|nfnet_bn|ghostnet|dpn\d", re.IGNORECASE)
# the attributes of those architectures that hold their BatchNorm layers (torchvision's ResNet ``layer1``..``layer4``,
# VGG / DenseNet / MobileNet ``features``, timm's ``blocks``), and the names under which a model keeps such
# a body (``self.backbone = resnet50()``); a classifier head (``fc``, ``classifier``) holds none
BATCHNORM_BODY_ATTRIBUTES = frozenset({"features", "layer1", "layer2", "layer3", "layer4", "backbone", "encoder",
                                       "blocks", "body", "trunk", "base", "base_model", "cnn", "conv_layers",
                                       "extractor", "feature_extractor"})


def builds_library_model(qualified: Optional[str]) -> bool:
    """A library's model builder: each call returns a new model of its architecture, every parameter trainable
    unless the caller freezes it (torchvision.models.<architecture>, timm.create_model)."""
    return qualified is not None and (qualified.startswith("torchvision.models.") or
                                      qualified in NAMED_ARCHITECTURE_BUILDERS)


def library_architecture_with_batchnorm(qualified: Optional[str], model_name: Optional[str] = None) -> Optional[str]:
    """The architecture a library model builder builds (``qualified``, the builder; ``model_name``, the name a
    ``create_model`` is given) when that architecture holds BatchNorm layers; None otherwise or when not known."""
    if not builds_library_model(qualified) or ".detection." in qualified:
        return None
    name = model_name if qualified in NAMED_ARCHITECTURE_BUILDERS else qualified.rsplit(".", 1)[-1]
    return name if name is not None and _BATCHNORM_ARCHITECTURES.search(name) else None


def norm_keeps_running_stats(layer: str, track_running_stats: Optional[bool]) -> bool:
    """Does a norm layer named ``layer``, built with ``track_running_stats`` (None: not given; a value that is not
    a constant is passed as True: it may keep them), normalize differently in eval mode?"""
    if layer in NORM_LAYERS_WITH_STATS:
        return track_running_stats is not False
    if layer in NORM_LAYERS_STATS_OPTIONAL:
        return track_running_stats is True
    return False


MASTER_WEIGHTS_LAST_NAMES = frozenset(name.rsplit(".", 1)[-1] for name, api in APIS.items()
                                      if Does.KEEPS_FP32_MASTER_WEIGHTS in api.does)


def names_an_optimizer_class(name: Optional[str]) -> bool:
    return bool(name) and name.rsplit(".", 1)[-1] in OPTIMIZER_CLASSES


def iterates_its_argument(name: Optional[str]) -> bool:
    """``name(x, ...)`` yields the items of ``x`` (``enumerate``, ``tqdm.auto.tqdm``, ``zip``)."""
    return bool(name) and name.rsplit(".", 1)[-1] in ITERATION_WRAPPERS


def is_library(qualified: Optional[str]) -> bool:
    """``qualified`` comes from an installed library or the standard library, not from this repository."""
    return qualified is not None and qualified.split(".", 1)[0] in LIBRARY_ROOTS


def is_data_loader(qualified: Optional[str]) -> bool:
    """``torch.utils.data.DataLoader`` (under either of its import paths)."""
    return does(qualified, Does.LOADS_BATCHES)


# Packages whose calls coordinate the processes of a distributed job: code that names one of them takes part in one
# (https://pytorch.org/docs/stable/distributed.html, https://pytorch.org/docs/stable/multiprocessing.html,
# https://pytorch.org/ignite/distributed.html, https://huggingface.co/docs/accelerate, https://www.deepspeed.ai,
# https://horovod.readthedocs.io)
DISTRIBUTED_PACKAGES = ("torch.distributed", "torch.multiprocessing", "ignite.distributed", "accelerate", "deepspeed",
                        "horovod")


def is_ddp(qualified: Optional[str]) -> bool:
    return does(qualified, Does.REPLICATES_PER_PROCESS)


def is_data_parallel(qualified: Optional[str]) -> bool:
    """``DataParallel`` or ``DistributedDataParallel``: a replica of the model per GPU or per process."""
    return does(qualified, Does.REPLICATES_PER_DEVICE) or does(qualified, Does.REPLICATES_PER_PROCESS)


# Methods and functions that report a value (print, log, progress bar, TensorBoard): a value reaching one is read on
# the host.
LOG_SINKS = {"print", "log", "info", "debug", "warning", "warn", "set_postfix", "set_postfix_str",
              "set_description", "add_scalar", "add_scalars", "log_metrics", "log_metric", "log_dict", "write",
              "append"}

# Libraries whose ``log`` computes a logarithm instead of writing a record (``math.log(loss.item())``).
_COMPUTING_ROOTS = frozenset({"math", "cmath", "numpy", "torch", "jax"})


def is_logging_call(method: Optional[str], qualified: Optional[str]) -> bool:
    """A call that writes values out (print, a logger, a progress bar, a metrics tracker, a list it appends to), by
    its method name (``qualified``: the call's name through the imports, when it has one)."""
    return method in LOG_SINKS and not (qualified is not None and qualified.split(".", 1)[0] in _COMPUTING_ROOTS)


# Tensor methods that copy a value to the host, so the host waits for the device to finish computing it.
SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}


# ---- what a loaded checkpoint is used as ------------------------------------------------------------
# What the use of ``torch.load``'s result says about the payload it unpickled (docs: torch.nn.Module, numpy.ndarray,
# torch.Tensor, dict). Read by :mod:`analyzers.program.payloads`.

# ``x.load_state_dict(loaded)``: nn.Module.load_state_dict and Optimizer.load_state_dict take a dict of tensors
# and plain values (https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict)
# (and nn.Module._load_from_state_dict(state_dict, prefix, ...), the per-module step load_state_dict runs)
STATE_DICT_CONSUMERS = frozenset({"load_state_dict", "set_state_dict", "_load_from_state_dict"})
# ``f(..., state_dict=loaded)``: the keyword load_state_dict and transformers' ``from_pretrained`` take a dict of
# tensors by ("state_dict (Dict[str, torch.Tensor])",
# https://huggingface.co/docs/transformers/main_classes/model#transformers.PreTrainedModel.from_pretrained)
STATE_DICT_KEYWORDS = frozenset({"state_dict"})
# methods only an nn.Module (or another whole pickled object) has: ``loaded.eval()`` means the file holds a module
MODULE_ONLY_METHODS = frozenset({"eval", "train", "parameters", "named_parameters", "modules", "named_modules",
                                 "children", "named_children", "forward", "buffers", "named_buffers", "apply",
                                 "zero_grad", "load_state_dict", "state_dict", "register_buffer", "add_module",
                                 "requires_grad_"})
# a NumPy array's, not a tensor's (https://numpy.org/doc/stable/reference/generated/numpy.ndarray.astype.html)
ARRAY_ONLY_METHODS = frozenset({"astype", "tobytes", "tofile", "ravel", "itemsize", "nbytes", "flat"})
# a dict's and a tensor's attributes: using them says nothing beyond "a dict" or "a tensor"
CONTAINER_ATTRIBUTES = frozenset({
    "keys", "items", "values", "get", "pop", "copy", "update", "setdefault", "popitem", "clear",
    "shape", "dtype", "device", "data", "grad", "T", "mT", "H", "ndim", "is_cuda", "requires_grad", "layout", "real",
    "imag", "names", "size", "to", "cuda", "cpu", "float", "double", "half", "bfloat16", "long", "int", "bool",
    "numpy", "item", "tolist", "detach", "clone", "contiguous", "view", "reshape", "squeeze", "unsqueeze", "permute",
    "transpose", "type", "append", "extend", "index", "count", "split", "strip", "format", "sum", "mean",
})
# NaN constants, by the library that defines them (https://docs.python.org/3/library/math.html#math.nan,
# https://numpy.org/doc/stable/reference/constants.html#numpy.nan, https://pytorch.org/docs/stable/torch.html#torch.nan):
# NaN compares unequal to everything, itself included
NAN_CONSTANTS = {"math.nan": "math", "numpy.nan": "numpy", "numpy.NaN": "numpy", "numpy.NAN": "numpy",
                 "torch.nan": "torch"}
# a dict's methods that give one of its items (https://docs.python.org/3/library/stdtypes.html#dict.get)
ITEM_METHODS = frozenset({"get", "pop"})
# methods that hand back the value they are called on, moved or cast, on a tensor (Tensor.to, .cuda, .float: "a
# Tensor with the specified device and/or dtype"; https://pytorch.org/docs/stable/generated/torch.Tensor.to.html) and
# on a module (MODULE_METHODS: "Returns: self"): what the result is used as, the value is
RETURNS_RECEIVER = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16"})
# builtins a loaded value may be handed to without deciding what it must be (printing it, counting it)
PLAIN_VALUE_BUILTINS = frozenset({"print", "len", "int", "float", "str", "bool", "repr", "type", "isinstance",
                                  "sorted", "list", "dict", "tuple", "set", "enumerate", "zip", "iter", "next",
                                  "sum", "max", "min", "any", "all", "hasattr", "getattr"})

# Whether a tensor tracks gradients before anyone sets ``requires_grad``: the creation ops make tensors that do
# not ("requires_grad (bool, optional) – If autograd should record operations on the returned tensor. Default:
# False.", https://pytorch.org/docs/stable/generated/torch.zeros.html and every creation op of
# https://pytorch.org/docs/stable/torch.html#creation-ops); an nn.Parameter does ("requires_grad (bool, optional)
# – if the parameter requires gradient. Default: True",
# https://pytorch.org/docs/stable/generated/torch.nn.parameter.Parameter.html), and so does every parameter
# ``Module.parameters()`` / ``named_parameters()`` yields (they are nn.Parameter objects).
TENSOR_CREATION_OPS = frozenset({
    "torch.tensor", "torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.rand", "torch.randn",
    "torch.randint", "torch.randperm", "torch.normal", "torch.arange", "torch.linspace", "torch.logspace", "torch.eye",
    "torch.zeros_like", "torch.ones_like", "torch.empty_like", "torch.full_like", "torch.rand_like",
    "torch.randn_like", "torch.randint_like", "torch.as_tensor", "torch.from_numpy", "torch.Tensor",
    "torch.FloatTensor", "torch.LongTensor", "torch.DoubleTensor",
})
PARAMETER_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
PARAMETER_ITERATORS = frozenset({"parameters"})
# tensor methods whose result tracks gradients exactly when their receiver does (a copy in another dtype, device
# or layout: https://pytorch.org/docs/stable/generated/torch.Tensor.to.html returns ``self`` or a copy of it)
SAME_GRAD_CONVERSIONS = frozenset({"float", "double", "half", "bfloat16", "long", "int", "to", "cuda", "cpu",
                                   "contiguous", "clone", "unsqueeze", "view", "reshape"})  # ``for p in model.parameters()``: each p is an nn.Parameter
