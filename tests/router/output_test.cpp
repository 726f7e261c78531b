// SPDX-License-Identifier: Apache-2.0
// What a route takes and gives (router/output.hpp): the defaults of the per-call options, the batch
// shape, the gradient terms and the routing output, and the loss backward scale a training schedule
// passes (loss_scale * CP / micro-batches, or the loss scale alone with per-token loss).
#include <megamoe/router/output.hpp>

#include <gtest/gtest.h>

namespace mr = megamoe::router;

namespace {

TEST(LossBackwardScale, IsLossScaleTimesCpOverMicroBatches) {
  EXPECT_DOUBLE_EQ(mr::loss_backward_scale(4096.0, 2, 8), 1024.0);
  EXPECT_DOUBLE_EQ(mr::loss_backward_scale(1.0, 1, 4), 0.25);
  EXPECT_DOUBLE_EQ(mr::loss_backward_scale(3.0, 4, 1), 12.0);
  // With per-token loss the schedule's scale goes through unchanged.
  EXPECT_DOUBLE_EQ(mr::loss_backward_scale(4096.0, 2, 8, true), 4096.0);
  static_assert(mr::loss_backward_scale(2.0, 3, 6) == 1.0, "usable at compile time");
}

TEST(RouteOptions, DefaultsAreATrainingPassWithoutMaskOrKey) {
  mr::route_options const options;
  EXPECT_EQ(options.mode, mr::pass::training);
  EXPECT_TRUE(options.padding_mask.empty());
  EXPECT_EQ(options.jitter_key, 0U);
  mr::batch_shape const batch;
  EXPECT_EQ(batch.seq_length, 0);
  EXPECT_EQ(batch.micro_batch_size, 1);
  mr::gradient_terms const terms;
  EXPECT_TRUE(terms.objective && terms.aux_loss && terms.seq_aux_loss && terms.global_aux_loss &&
              terms.z_loss);
}

TEST(RoutingOutput, StartsEmptyWithoutCapacityOrLosses) {
  mr::routing_output<float> const out;
  EXPECT_EQ(out.probs.size(), 0);
  EXPECT_EQ(out.routing_map.size(), 0);
  EXPECT_TRUE(out.tokens_per_expert.empty());
  EXPECT_EQ(out.topk_probs.size(), 0);
  EXPECT_EQ(out.topk_indices.size(), 0);
  EXPECT_EQ(out.capacity, 0);
  EXPECT_FALSE(out.losses.aux_loss || out.losses.seq_aux_loss || out.losses.global_aux_loss ||
               out.losses.z_loss);
  mr::attached_loss const loss;
  EXPECT_EQ(loss.value, 0.0);
  EXPECT_EQ(loss.unscaled, 0.0);
}

}  // namespace
