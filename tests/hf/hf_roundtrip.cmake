# SPDX-License-Identifier: Apache-2.0
# A preset through Hugging Face and back, checked against hf_forward.py's independent forward:
#   1. megamoe-train trains the preset a few steps on a layout (EP, TP or PP) and saves;
#   2. megamoe-checkpoint export --format hf writes the architecture's folder (sharded);
#   3. megamoe-train --skip-train writes the checkpoint's logits on two held-out windows, and
#      hf_forward.py gives the same from the folder (1e-5 of the largest logit), and not with a
#      planted fault (gate and up swapped, an expert's rows shifted, the other RoPE pairing);
#   4. import --format hf gives back the checkpoint's tensors bit for bit;
#   5. the same from the run's model.safetensors, exported as one file, and as BF16 values
#      rounded to nearest even;
#   6. a folder hf_forward.py writes with random weights (BF16, sharded) imports, loads on the
#      layout and gives hf_forward.py's logits;
#   7. with REFUSALS: bad folders and a mismatched preset fail, naming what is wrong.
# Run as: cmake -DTRAIN=... -DCHECKPOINT=... -DMPIEXEC=... -DPYTHON=... -DSCRIPT=... -DSAMPLE=...
#   -DPRESET=... -DARCH=... -DRANKS=... -DLAYOUT=--ep=4 -DOUT=... [-DREFUSALS=ON] -P
file(REMOVE_RECURSE ${OUT})
set(data --data ${SAMPLE} --seq-len 32 --micro-batch 2 --global-batch 8 --eval-iters 0
    --sample-bytes 0)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed:\n${out}\n${err}")
  endif()
  string(REGEX MATCH "hf_forward[^\n]*" line "${out}")
  if(line)
    message(STATUS "${line}")
  endif()
endfunction()

# `what` must fail with a message matching `expected`.
function(refused what expected)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what} succeeded; it should fail with '${expected}':\n${out}")
  endif()
  if(NOT "${out}${err}" MATCHES "${expected}")
    message(FATAL_ERROR "${what} failed without '${expected}':\n${out}\n${err}")
  endif()
  string(REGEX MATCH "(hf_forward|megamoe: rank 0)[^\n]*" line "${out}${err}")
  message(STATUS "refused as expected: ${line}")
endfunction()

run("training ${PRESET} on ${LAYOUT}"
    ${MPIEXEC} --oversubscribe -n ${RANKS} ${TRAIN} --preset ${PRESET} ${LAYOUT} ${data} --steps 3
    --save ${OUT}/trained --out ${OUT}/train)
run("export" ${CHECKPOINT} export --format hf --arch ${ARCH} --max-shard-size 20000000
    ${OUT}/trained ${OUT}/hf)
file(GLOB shards ${OUT}/hf/model-*-of-*.safetensors)
list(LENGTH shards count)
if(count LESS 2 OR NOT EXISTS ${OUT}/hf/model.safetensors.index.json)
  message(FATAL_ERROR "the export is not sharded with an index (${count} shards)")
endif()
file(READ ${OUT}/hf/config.json config)
message(STATUS "config.json of the export:\n${config}")

# The logits of the trained checkpoint (one rank) against the exported folder's.
set(skip --skip-train --logits-samples 2 --finetune)
run("logits of the trained model" ${MPIEXEC} --oversubscribe -n 1 ${TRAIN} --preset ${PRESET}
    ${data} ${skip} --load ${OUT}/trained --logits-out ${OUT}/trained_logits.safetensors
    --out ${OUT}/trained_eval)
run("the exported folder's forward" ${PYTHON} ${SCRIPT} compare --model ${OUT}/hf
    --logits ${OUT}/trained_logits.safetensors)
foreach(fault gate_up_swap expert_shift rope_layout)
  refused("the forward with ${fault}" "DIFFER" ${PYTHON} ${SCRIPT} compare --model ${OUT}/hf
          --logits ${OUT}/trained_logits.safetensors --fault ${fault})
endforeach()

# Back: the same tensors, bit for bit.
run("import" ${CHECKPOINT} import --format hf ${OUT}/hf ${OUT}/imported)
run("export of the trained checkpoint" ${CHECKPOINT} export ${OUT}/trained ${OUT}/trained.safetensors)
run("export of the imported checkpoint" ${CHECKPOINT} export ${OUT}/imported ${OUT}/imported.safetensors)
run("the round trip" ${PYTHON} ${SCRIPT} same-tensors ${OUT}/trained.safetensors
    ${OUT}/imported.safetensors)

# From the run's model.safetensors (gathered from the layout's ranks) as one file, no index.
run("export of model.safetensors" ${CHECKPOINT} export --format hf --arch ${ARCH}
    ${OUT}/train/model.safetensors ${OUT}/hf_whole)
if(NOT EXISTS ${OUT}/hf_whole/model.safetensors OR EXISTS ${OUT}/hf_whole/model.safetensors.index.json)
  message(FATAL_ERROR "the export below --max-shard-size is not one model.safetensors")
endif()
run("import of one file" ${CHECKPOINT} import --format hf ${OUT}/hf_whole ${OUT}/imported_whole)
run("export of that import" ${CHECKPOINT} export ${OUT}/imported_whole ${OUT}/imported_whole.safetensors)
run("model.safetensors's round trip" ${PYTHON} ${SCRIPT} same-tensors ${OUT}/trained.safetensors
    ${OUT}/imported_whole.safetensors)

# As BF16: config.json says so, and the import holds the trained values rounded to BF16.
run("export as BF16" ${CHECKPOINT} export --format hf --arch ${ARCH} --dtype bf16
    ${OUT}/trained ${OUT}/hf_bf16)
file(READ ${OUT}/hf_bf16/config.json text)
if(NOT text MATCHES "\"torch_dtype\": \"bfloat16\"")
  message(FATAL_ERROR "a BF16 export's config.json does not say bfloat16")
endif()
run("import of BF16" ${CHECKPOINT} import --format hf ${OUT}/hf_bf16 ${OUT}/imported_bf16)
run("export of that import" ${CHECKPOINT} export ${OUT}/imported_bf16 ${OUT}/imported_bf16.safetensors)
run("the BF16 round trip" ${PYTHON} ${SCRIPT} same-tensors --bf16 ${OUT}/trained.safetensors
    ${OUT}/imported_bf16.safetensors)

# A folder with random weights, loaded on the layout.
run("a random folder" ${PYTHON} ${SCRIPT} random --like ${OUT}/hf/config.json --out ${OUT}/random)
run("its import" ${CHECKPOINT} import --format hf ${OUT}/random ${OUT}/random_checkpoint)
run("its logits on ${LAYOUT}" ${MPIEXEC} --oversubscribe -n ${RANKS} ${TRAIN} --preset ${PRESET}
    ${LAYOUT} ${data} ${skip} --load ${OUT}/random_checkpoint
    --logits-out ${OUT}/random_logits.safetensors --out ${OUT}/random_eval)
run("the random folder's forward" ${PYTHON} ${SCRIPT} compare --model ${OUT}/random
    --logits ${OUT}/random_logits.safetensors)

if(REFUSALS)
  foreach(case "llama;\"MixtralForCausalLM\";\"LlamaForCausalLM\";is not one megamoe converts"
               "gelu;\"silu\";\"gelu\";hidden_act is \"gelu\""
               "experts;\"num_local_experts\": 8;\"num_local_experts\": 7;block_sparse_moe.gate.weight is \\[8,256\\], config.json's \\[7,256\\]"
               "window;\"sliding_window\": null;\"sliding_window\": 4096;sliding_window is 4096")
    list(GET case 0 name)
    list(GET case 1 from)
    list(GET case 2 to)
    list(GET case 3 expected)
    file(COPY ${OUT}/random/ DESTINATION ${OUT}/bad_${name})
    file(READ ${OUT}/random/config.json text)
    string(REPLACE "${from}" "${to}" text "${text}")
    file(WRITE ${OUT}/bad_${name}/config.json "${text}")
    refused("a folder with ${name}" "${expected}"
            ${CHECKPOINT} import --format hf ${OUT}/bad_${name} ${OUT}/bad_${name}_checkpoint)
  endforeach()
  # A shard gone: its tensors are missing.
  file(COPY ${OUT}/random/ DESTINATION ${OUT}/bad_shard)
  file(GLOB second ${OUT}/bad_shard/model-00002-of-*.safetensors)
  file(REMOVE ${OUT}/bad_shard/model.safetensors.index.json ${second})
  refused("a folder without its second shard" "the folder has no model.layers"
          ${CHECKPOINT} import --format hf ${OUT}/bad_shard ${OUT}/bad_shard_checkpoint)
  # The index names a file that does not hold the tensor.
  file(COPY ${OUT}/random/ DESTINATION ${OUT}/bad_index)
  file(READ ${OUT}/random/model.safetensors.index.json text)
  string(REGEX REPLACE "(\"lm_head.weight\": \")model-[0-9]+" "\\1model-00009" text "${text}")
  file(WRITE ${OUT}/bad_index/model.safetensors.index.json "${text}")
  refused("an index naming the wrong file" "lm_head.weight"
          ${CHECKPOINT} import --format hf ${OUT}/bad_index ${OUT}/bad_index_checkpoint)
  # Exports the architecture cannot compute, and a preset of other sizes.
  refused("DeepSeek-V3 from grouped-query attention" "multi_latent_attention is not set"
          ${CHECKPOINT} export --format hf --arch deepseek_v3 ${OUT}/trained ${OUT}/x_deepseek)
  refused("Qwen3-MoE without QK layernorm" "qk_layernorm is false"
          ${CHECKPOINT} export --format hf --arch qwen3_moe ${OUT}/trained ${OUT}/x_qwen3)
  refused("the import loaded into another preset" "saved by another model: hidden_size is 256 there, 128 here"
          ${MPIEXEC} --oversubscribe -n 1 ${TRAIN} --preset small ${data} ${skip}
          --load ${OUT}/imported --out ${OUT}/x_small)
endif()
