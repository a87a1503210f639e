# Points the references to the design notes at docs/ and names the papers, in the files
# outside docs/ (the notes themselves link to each other by bare name). Idempotent. Run from
# the repository root over the tracked text files that need it:
#
#   git grep -lz -e ALGORITHMS.md -e ARCHITECTURE.md -e STYLE.md -e shared/design \
#       -e shared/anchors -e 'paper 00' -e "seeds'" -e 'pool.go' -- ':!docs/' ':!scripts/docs-refs.sed' |
#       xargs -0 sed -i -f scripts/docs-refs.sed

# The design notes moved from ../shared/design/ to docs/.
s#\.\./shared/design/\([A-Z]*\.md\)#docs/\1#g
s#/work/shared/design/\([A-Z]*\.md\)#docs/\1#g
s#`\.\./shared/design/`#`docs/`#g
s#\([^/A-Za-z_.-]\|^\)\(ALGORITHMS\|ARCHITECTURE\|STYLE\)\.md#\1docs/\2.md#g
# The PyTorch anchors moved to scripts/anchors/.
s#\.\./shared/anchors/\(torch_cifar_vgg[a-z_]*\.py\)#scripts/anchors/\1#g

# The papers by their authors and venues (docs/ALGORITHMS.md, "The papers").
s/paper 000/Zhao et al., ICDE 2024/g
s/paper 001/Li and Hoefler, PPoPP 2022/g
s/paper 002/Chen et al., ICPP 2023/g
s/paper 003/Shi et al., INFOCOM 2020/g
s/paper 004/Meng et al., arXiv 2023/g

# "The seeds" were the papers and their authors' code.
s/the seeds' LSTM-IMDB/SparDL's LSTM-IMDB/g
s/the seeds' IMDB script/SparDL's IMDB script/g
s/the seeds' 66,034,000-parameter/SparDL's 66,034,000-parameter/g
s/(seeds' `lstm-ptb`)/(SparDL's `lstm-ptb`)/g
s/the seeds' 1500-unit/SparDL's 1500-unit/g
s/the seeds' PTB/SparDL's PTB/g
s/The seeds' PTB/SparDL's PTB/g
s/or the seeds' 1500-unit one/or SparDL's 1500-unit one/g
s/ptb (the seeds')/ptb (SparDL's)/g
s/which is also the seeds' model (Ok-Topk/which is also the model of SparDL's LSTM-PTB (from Ok-Topk's code,/g
s/the seeds' model (issue 10's table)/SparDL's LSTM-PTB (issue 10's table)/g
s/word_language_model's and the seeds' init_weights/word_language_model's and Ok-Topk's init_weights/g
s/and the seeds' (Ok-Topk /and Ok-Topk's (/g
s/The seeds' own recipe for their 1500-unit model/The authors' reference code's recipe for the 1500-unit model/g
s/the seeds' ResNet-20/He et al.'s CIFAR ResNet-20/g
s/the seeds' CIFAR experiments/the SparDL and Ok-Topk papers' CIFAR experiments/g
s/networks of the seeds' experiments/networks of the papers' experiments (docs\/ALGORITHMS.md)/g
s/the seeds' ptb_reader/TensorFlow's PTB reader/g
s/The seeds' ptb_reader/TensorFlow's PTB reader/g
s/seeds' ptb_reader/TensorFlow's PTB reader/g
s/the seeds' _build_vocab/_build_vocab of TensorFlow's PTB reader (ptb\/reader.py)/g
s/the seeds' order/the order of TensorFlow's PTB reader/g
s/and the seeds' ids/and the ids of TensorFlow's PTB reader/g
s/the rule of the seeds'$/the rule of SparDL's/g
s/Goyal et al.; the seeds' recipe, as before/Goyal et al.'s recipe, as before/g
s/(the seeds' recipe), with one/(Goyal et al.'s recipe), with one/g
s/Without -schedule it is the seeds' recipe/Without -schedule it is Goyal et al.'s recipe/g
s/The seeds' recipe: from lr\/P/Goyal et al.'s recipe: from lr\/P/g
s/WarmupStep is the seeds' recipe/WarmupStep is Goyal et al.'s warm-up and step decay/g
s/(the seeds' VGG recipe)/(Goyal et al.)/g
s/is the seeds' warm-up from lr\/workers/is Goyal et al.'s warm-up from lr\/workers/g
s/has the seeds' recipe as defaults/has the PyTorch anchor's recipe (scripts\/anchors\/torch_cifar_vgg.py) as defaults/g
s/with the seeds' lr 0.01/with the PyTorch anchor's lr 0.01/g
s/constant rate (the seeds' recipe)/constant rate (the PyTorch anchor's recipe)/g
s/Reproducing the seeds' claims/Reproducing the papers' claims/g
s/the seeds'$/SparDL's/g

# kernels: the worker pool's file was renamed.
s/dispatch in pool\.go/dispatch in workers.go/g
